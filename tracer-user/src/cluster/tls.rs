//! TLS for agent connections that leave the machine (rustls, with certificates in PEM files).

use std::{path::Path, sync::Arc};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{
    TlsAcceptor, TlsConnector,
    rustls::{
        ClientConfig, RootCertStore, ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {path}: {reason}")]
    Pem { what: &'static str, path: String, reason: String },
    #[error("invalid TLS configuration: {0}")]
    Config(String),
    #[error("'{0}' is not a valid TLS server name")]
    ServerName(String),
    #[error("TLS handshake failed")]
    Handshake(#[source] std::io::Error),
}

/// A connection, plain or encrypted.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

fn provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |reason: String| TlsError::Pem { what, path: path.display().to_string(), reason };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem("no certificate in it".to_string()));
    }
    Ok(certs)
}

/// The agent's side: its certificate chain and private key.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates(cert, "TLS certificate")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        what: "TLS private key",
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The collector's side: the certificate authorities it trusts.
pub fn connector(ca: &Path) -> Result<TlsConnector, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca, "TLS certificate authority")? {
        roots.add(cert).map_err(|e| TlsError::Config(e.to_string()))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Wraps an accepted connection, if TLS is on.
pub async fn accept(tls: Option<&TlsAcceptor>, tcp: Box<dyn Transport>) -> Result<Box<dyn Transport>, TlsError> {
    match tls {
        None => Ok(tcp),
        Some(acceptor) => Ok(Box::new(acceptor.accept(tcp).await.map_err(TlsError::Handshake)?)),
    }
}

/// Wraps an outgoing connection, if TLS is on; `name` is the agent's name in its certificate.
pub async fn connect(
    tls: Option<&TlsConnector>,
    name: &str,
    tcp: Box<dyn Transport>,
) -> Result<Box<dyn Transport>, TlsError> {
    match tls {
        None => Ok(tcp),
        Some(connector) => {
            let name = ServerName::try_from(name.to_string()).map_err(|_| TlsError::ServerName(name.to_string()))?;
            Ok(Box::new(connector.connect(name, tcp).await.map_err(TlsError::Handshake)?))
        }
    }
}
