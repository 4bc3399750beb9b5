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
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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

/// A certificate or key file: like every file that decides where cronlock connects, owned by
/// this user or root and writable by nobody else ([`crate::files::untrusted`]).
fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let cannot = |e: std::io::Error| {
        let text = crate::log::io_text(&e);
        anyhow!("cannot read {flag} '{}': {text}", path.display())
    };
    let file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    let harm = "make cronlock trust a server of theirs";
    if let Some(why) = crate::files::untrusted(path, &meta, harm) {
        anyhow::bail!("{flag} '{}': {why}", path.display());
    }
    let mut bytes = Vec::new();
    // A certificate chain is kilobytes; a bound keeps a wrong path from filling memory.
    file.take(4 << 20).read_to_end(&mut bytes).map_err(cannot)?;
    Ok(bytes)
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

/// A TLS failure as one line that says what to do, matched on what rustls reports (its error
/// variants, never their text).
pub fn explain(e: &rustls::Error) -> String {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error};
    let what = match e {
        Error::InvalidCertificate(Cert::UnknownIssuer) => {
            "the server's certificate is not trusted (unknown issuer or self-signed): pass the CA \
             with --tls-ca-cert"
        }
        Error::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            "the server's certificate is not valid for the host name in the URL"
        }
        Error::InvalidCertificate(
            Cert::Expired
            | Cert::ExpiredContext { .. }
            | Cert::NotValidYet
            | Cert::NotValidYetContext { .. },
        ) => "the server's certificate has expired (or is not valid yet)",
        Error::AlertReceived(Alert::CertificateRequired | Alert::HandshakeFailure) => {
            "the server requires a client certificate: pass --tls-cert and --tls-key"
        }
        Error::AlertReceived(Alert::BadCertificate | Alert::UnknownCA) => {
            "the server refused the client certificate (--tls-cert)"
        }
        Error::InvalidMessage(_)
        | Error::InappropriateMessage { .. }
        | Error::InappropriateHandshakeMessage { .. } => {
            "the server did not answer TLS: is it a plain port? use redis:// for it"
        }
        _ => return format!("TLS failed: {e}"),
    };
    what.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_are_told_by_their_variant() {
        use rustls::{AlertDescription, CertificateError, Error, InvalidMessage};
        let said = |e: Error| explain(&e);
        assert!(
            said(Error::InvalidCertificate(CertificateError::UnknownIssuer))
                .contains("not trusted")
        );
        assert!(
            said(Error::InvalidCertificate(CertificateError::NotValidForName))
                .contains("not valid for the host name")
        );
        assert!(said(Error::InvalidCertificate(CertificateError::Expired)).contains("expired"));
        assert!(
            said(Error::AlertReceived(AlertDescription::CertificateRequired))
                .contains("requires a client certificate")
        );
        assert!(said(Error::AlertReceived(AlertDescription::UnknownCA))
            .contains("refused the client certificate"));
        assert!(
            said(Error::InvalidMessage(InvalidMessage::InvalidContentType)).contains("plain port")
        );
        assert!(said(Error::DecryptError).starts_with("TLS failed: "));
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
