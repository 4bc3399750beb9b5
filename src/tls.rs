//! TLS for `rediss://`: which CAs to trust and which client certificate to show, read once and
//! handed to redis-rs' own rustls support (pure Rust, so the static binary stays static).
//!
//! Trust: the CA file given with `--tls-ca-cert`, else the system's store, else (a `FROM scratch`
//! image has no store at all) the Mozilla roots bundled in the binary (`webpki-roots`, through
//! redis-rs' `tls-rustls-webpki-roots`). Mutual TLS: `--tls-cert` with `--tls-key`.
//!
//! Errors name the file or the flag at fault, and TLS failures from rustls are turned into one
//! line that says what to do ([`explain`]).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use redis::{ClientTlsConfig, TlsCertificates};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS options from the command line.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    pub ca_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl TlsOptions {
    pub fn any(&self) -> bool {
        self.ca_cert.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// Check the combination; files are read later, for a `rediss://` URL only.
    pub fn check(&self) -> Result<()> {
        match (&self.cert, &self.key) {
            (Some(_), None) => bail!("--tls-cert needs --tls-key (the certificate's private key)"),
            (None, Some(_)) => bail!("--tls-key needs --tls-cert (the client certificate)"),
            _ => Ok(()),
        }
    }

    /// Read and check the files into what redis-rs takes.
    pub fn certificates(&self) -> Result<TlsCertificates> {
        let root_cert = match &self.ca_cert {
            Some(path) => {
                let pem = read(path, "--tls-ca-cert")?;
                let n = CertificateDer::pem_slice_iter(&pem)
                    .filter_map(Result::ok)
                    .count();
                if n == 0 {
                    bail!(
                        "--tls-ca-cert '{}' holds no PEM certificate",
                        path.display()
                    );
                }
                Some(pem)
            }
            None => system_roots(),
        };
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let client_cert = read(cert, "--tls-cert")?;
                let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&client_cert)
                    .filter_map(Result::ok)
                    .collect();
                if chain.is_empty() {
                    bail!("--tls-cert '{}' holds no PEM certificate", cert.display());
                }
                let client_key = read(key, "--tls-key")?;
                let der = PrivateKeyDer::from_pem_slice(&client_key).map_err(|_| {
                    anyhow!("--tls-key '{}' holds no PEM private key", key.display())
                })?;
                check_pair(&chain, der, cert, key)?;
                Some(ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            _ => None,
        };
        Ok(TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        let text = crate::log::io_text(&e);
        anyhow!("cannot read {flag} '{}': {text}", path.display())
    })
}

/// The key must belong to the certificate: otherwise the server's refusal would say nothing.
fn check_pair(
    chain: &[CertificateDer<'static>],
    key: PrivateKeyDer<'static>,
    cert: &Path,
    key_path: &Path,
) -> Result<()> {
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| anyhow!("--tls-key '{}': {e}", key_path.display()))?;
    let certified = rustls::sign::CertifiedKey::new(chain.to_vec(), signing);
    match certified.keys_match() {
        Ok(()) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => bail!(
            "--tls-key '{}' does not belong to --tls-cert '{}'",
            key_path.display(),
            cert.display()
        ),
        // Unknown (a key type that cannot say): let the server decide.
        Err(_) => Ok(()),
    }
}

/// The system's CA certificates as PEM, or `None` when it has none (then redis-rs uses the
/// bundled Mozilla roots).
fn system_roots() -> Option<Vec<u8>> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        return None;
    }
    let mut pem = Vec::new();
    for cert in &found.certs {
        pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        for line in base64(cert.as_ref()).as_bytes().chunks(64) {
            pem.extend_from_slice(line);
            pem.push(b'\n');
        }
        pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    Some(pem)
}

/// Standard base64 with padding (for PEM).
fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A TLS failure in words a user can act on, or `None` when `text` is not about TLS.
pub fn explain(text: &str) -> Option<String> {
    let t = text.to_ascii_lowercase();
    let what = if t.contains("unknownissuer") || t.contains("unknown issuer") {
        "the server's certificate is not trusted (unknown issuer or self-signed): pass the CA \
         with --tls-ca-cert"
    } else if t.contains("notvalidforname") || t.contains("not valid for name") {
        "the server's certificate is not valid for the host name in the URL"
    } else if t.contains("expired") {
        "the server's certificate has expired (or is not valid yet)"
    } else if t.contains("certificaterequired")
        || t.contains("certificate required")
        || t.contains("handshakefailure") && t.contains("alert")
    {
        "the server requires a client certificate: pass --tls-cert and --tls-key"
    } else if t.contains("badcertificate") || t.contains("unknownca") || t.contains("unknown ca") {
        "the server refused the client certificate (--tls-cert)"
    } else if t.contains("corrupt message")
        || t.contains("invalidcontenttype")
        || t.contains("invalid content type")
        || t.contains("invalidmessage")
    {
        "the server did not answer TLS: is it a plain port? use redis:// for it"
    } else if t.contains("unable to build client with tls parameters") {
        let why = text.rsplit(": ").next().unwrap_or(text);
        return Some(format!("--tls-cert or --tls-key cannot be used: {why}"));
    } else if t.contains("invalid peer certificate") || t.contains("tls") {
        return Some(format!("TLS failed: {text}"));
    } else {
        return None;
    };
    Some(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn cert_without_key_is_refused() {
        let o = TlsOptions {
            cert: Some("c.pem".into()),
            ..Default::default()
        };
        assert!(o.check().is_err());
    }
}
