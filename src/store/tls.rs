//! TLS for `rediss://`: which CAs to trust and which client certificate to show, read once into a
//! rustls client configuration (pure Rust, so the static binary stays static) that every
//! connection of the run shares ([`crate::store::wire`]).
//!
//! Trust: the CA file given with `--tls-ca-cert`, else the system's store, else (a `FROM scratch`
//! image has no store at all) the Mozilla roots bundled in the binary (`webpki-roots`).
//! Mutual TLS: `--tls-cert` with `--tls-key`.
//!
//! Errors name the file or the flag at fault, and TLS failures from rustls are turned into one
//! line that says what to do ([`explain`]).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
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
    /// The rustls client configuration: the CA (`--tls-ca-cert`, else the system's store, else
    /// the bundled web roots) and the client certificate, checked to belong to its key.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>> {
        let mut roots = RootCertStore::empty();
        match &self.ca_cert {
            Some(path) => {
                let pem = read(path, "--tls-ca-cert")?;
                for cert in CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok) {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    bail!(
                        "--tls-ca-cert '{}' holds no PEM certificate",
                        path.display()
                    );
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
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
                check_pair(&chain, der.clone_key(), cert, key)?;
                builder
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| anyhow!("--tls-cert or --tls-key cannot be used: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
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

/// A TLS failure (rustls' words) as one line that says what to do, if it is one.
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
    fn cert_without_key_is_refused() {
        let o = TlsOptions {
            cert: Some("c.pem".into()),
            ..Default::default()
        };
        assert!(o.check().is_err());
    }
}
