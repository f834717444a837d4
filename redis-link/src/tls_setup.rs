//! [`TlsOptions`] loaded for use: the one place where the files are read and the rustls client configuration is
//! built, for every Redis connection the project opens.
//!
//! redis-rs (connection managers, the cluster connection, node connections) takes the same roots and client
//! identity as [`redis::TlsCertificates`]; the pipelined connection takes the rustls [`ClientConfig`] itself.
//! Both come from one [`RedisTls`], built once when a component is built, so a missing or malformed file is a
//! configuration error then, never a connection failure later.
//!
//! redis-rs replaces the system's roots when it is given a root certificate, while a CA file here is trusted
//! *besides* them: the roots handed to redis-rs are the system's and the file's, in one PEM text.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

use crate::tls::TlsOptions;

/// A TLS setting that cannot be used, found when a component is built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file named by the options cannot be read.
    #[error("cannot read the TLS {what} file {path}: {source}")]
    ReadFile {
        /// Which file: `CA`, `client certificate`, `client key`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no PEM block of the kind expected, or a malformed one.
    #[error("the TLS {what} file {path} holds no usable PEM {expected}: {reason}")]
    BadPem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What it should hold (`CERTIFICATE`, `PRIVATE KEY`).
        expected: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A client certificate without its key, or a key without its certificate.
    #[error("a TLS client certificate needs its key and a key its certificate (only {given} given)")]
    IncompleteIdentity {
        /// The one given.
        given: &'static str,
    },
    /// The client certificate and key do not form an identity rustls accepts (e.g. a key of another certificate).
    #[error("TLS client certificate {cert} with key {key}: {reason}")]
    BadIdentity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        reason: String,
    },
    /// The system's root certificates could not be read.
    #[error("cannot read the system's root certificates: {0}")]
    SystemRoots(String),
    /// [`TlsOptions::server_name`] for a Redis connection: redis-rs checks the URL's host and cannot be told
    /// another name, so the setting would hold for some connections and not others.
    #[error("TLS server_name is not supported for Redis connections: put the certificate's name in the URL's host")]
    ServerNameUnsupported,
    /// TLS settings for a URL that is not `rediss://` (the settings would silently not apply).
    #[error("TLS settings are given but {url} is not a rediss:// URL: use rediss:// to connect with TLS")]
    PlainUrl {
        /// The URL, password redacted.
        url: String,
    },
}

/// [`TlsOptions`] with their files read: the roots, the client identity and the rustls configuration, ready for
/// every connection. Cheap to clone.
#[derive(Clone)]
pub struct RedisTls {
    inner: Arc<Loaded>,
}

struct Loaded {
    options: TlsOptions,
    /// For redis-rs: the roots (system and CA file, PEM) and the client identity.
    certificates: redis::TlsCertificates,
    /// For the pipelined connection.
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl RedisTls {
    /// Reads the files `options` name and builds the client configuration.
    ///
    /// # Errors
    /// [`TlsError`]: a file unreadable or without the PEM it should hold, half a client identity, a key that does
    /// not match its certificate, unreadable system roots, [`TlsOptions::server_name`] set.
    pub fn load(options: &TlsOptions) -> Result<RedisTls, TlsError> {
        // Several rustls providers may be compiled in (another crate's choice): name ours once for the process,
        // or rustls's default builder refuses to pick. Losing the race to another installer is fine.
        let _ = provider().install_default();
        if options.server_name.is_some() {
            return Err(TlsError::ServerNameUnsupported);
        }
        let mut roots = RootCertStore::empty();
        let mut roots_pem = String::new();
        let system = rustls_native_certs::load_native_certs();
        if system.certs.is_empty() {
            if let Some(e) = system.errors.first() {
                return Err(TlsError::SystemRoots(e.to_string()));
            }
        }
        for cert in system.certs {
            // A system root rustls cannot parse is skipped, as redis-rs and browsers do.
            if roots.add(cert.clone()).is_ok() {
                push_pem(&mut roots_pem, "CERTIFICATE", &cert);
            }
        }
        if let Some(path) = &options.ca_file {
            for cert in read_certs("CA", path)? {
                roots.add(cert.clone()).map_err(|e| TlsError::BadPem {
                    what: "CA",
                    path: path.clone(),
                    expected: "CERTIFICATE",
                    reason: e.to_string(),
                })?;
                push_pem(&mut roots_pem, "CERTIFICATE", &cert);
            }
        }
        let identity = match (&options.client_cert_file, &options.client_key_file) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsError::IncompleteIdentity {
                    given: "the certificate",
                })
            }
            (None, Some(_)) => return Err(TlsError::IncompleteIdentity { given: "the key" }),
            (Some(cert), Some(key)) => Some((cert, key, read_certs("client certificate", cert)?, read_key(key)?)),
        };
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let mut config =
            match &identity {
                None => builder.with_no_client_auth(),
                Some((cert, key, chain, der)) => builder
                    .with_client_auth_cert(chain.clone(), der.clone_key())
                    .map_err(|e| TlsError::BadIdentity {
                        cert: (*cert).clone(),
                        key: (*key).clone(),
                        reason: e.to_string(),
                    })?,
            };
        if options.insecure_skip_verify {
            insecure::accept_any(&mut config);
        }
        let client_tls = identity.map(|(cert, key, _, _)| -> Result<_, TlsError> {
            Ok(redis::ClientTlsConfig {
                client_cert: read_file("client certificate", cert)?,
                client_key: read_file("client key", key)?,
            })
        });
        Ok(RedisTls {
            inner: Arc::new(Loaded {
                options: options.clone(),
                certificates: redis::TlsCertificates {
                    client_tls: client_tls.transpose()?,
                    root_cert: Some(roots_pem.into_bytes()),
                },
                config: Arc::new(config),
            }),
        })
    }

    /// The settings these were loaded from.
    pub fn options(&self) -> &TlsOptions {
        &self.inner.options
    }

    /// The rustls configuration of a TLS connection opened by hand (the pipelined connection).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.inner.config.clone()
    }

    /// The roots and client identity in redis-rs's form (its cluster builder's `certs`).
    pub fn certificates(&self) -> redis::TlsCertificates {
        self.inner.certificates.clone()
    }

    /// The settings of the system's roots alone, for a `rediss://` URL given without [`TlsOptions`]; loaded once.
    ///
    /// # Errors
    /// The system's roots unreadable.
    pub fn system_default() -> Result<RedisTls, TlsError> {
        static DEFAULT: OnceLock<RedisTls> = OnceLock::new();
        if let Some(tls) = DEFAULT.get() {
            return Ok(tls.clone());
        }
        let tls = RedisTls::load(&TlsOptions::default())?;
        Ok(DEFAULT.get_or_init(|| tls).clone())
    }
}

/// The redis-rs connection settings of `url` with `tls` applied: for a `rediss://` URL its roots, client
/// identity and (with [`TlsOptions::insecure_skip_verify`], logged) no verification; a `redis://` or
/// `redis+unix://` URL is taken as it is when `tls` is `None`.
///
/// Every redis-rs client of the project is opened through this function (or [`client`]), so all of them verify
/// the same way.
///
/// # Errors
/// A URL redis-rs refuses; `tls` given for a URL that is not `rediss://` ([`TlsError::PlainUrl`], as an
/// `InvalidClientConfig` error).
pub fn connection_info(url: &str, tls: Option<&RedisTls>) -> redis::RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    apply(info, tls, url)
}

/// A redis-rs client for `url` with `tls` applied (see [`connection_info`]).
///
/// # Errors
/// As [`connection_info`].
pub fn client(url: &str, tls: Option<&RedisTls>) -> redis::RedisResult<redis::Client> {
    redis::Client::open(connection_info(url, tls)?)
}

/// redis-rs's cluster builder for `seeds` with `tls` applied: redis-rs takes TLS for every node (discovered or
/// named by a redirect) from the first seed's scheme, and the roots and client identity from `certs`.
///
/// # Errors
/// As [`connection_info`], for any seed.
pub fn cluster_builder(
    seeds: &[String],
    tls: Option<&RedisTls>,
) -> redis::RedisResult<redis::cluster::ClusterClientBuilder> {
    let mut infos = Vec::with_capacity(seeds.len());
    for seed in seeds {
        infos.push(connection_info(seed, tls)?);
    }
    let mut builder = redis::cluster::ClusterClientBuilder::new(infos);
    if seeds.first().is_some_and(|s| is_tls_url(s)) {
        let tls = match tls {
            Some(tls) => tls.clone(),
            None => RedisTls::system_default().map_err(config_error)?,
        };
        if tls.options().insecure_skip_verify {
            builder = builder.tls(redis::TlsMode::Insecure);
        }
        builder = builder.certs(tls.certificates());
    }
    Ok(builder)
}

/// Whether `url` asks for TLS (`rediss://`).
pub fn is_tls_url(url: &str) -> bool {
    url.trim_start()
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
}

fn apply(info: ConnectionInfo, tls: Option<&RedisTls>, url: &str) -> redis::RedisResult<ConnectionInfo> {
    let ConnectionAddr::TcpTls {
        host, port, insecure, ..
    } = info.addr().clone()
    else {
        return match tls {
            None => Ok(info),
            Some(_) => Err(config_error(TlsError::PlainUrl {
                url: protocol::redact::redact_url(url),
            })),
        };
    };
    let tls = match tls {
        Some(tls) => tls.clone(),
        None => RedisTls::system_default().map_err(config_error)?,
    };
    let insecure = insecure || tls.options().insecure_skip_verify;
    if insecure {
        tracing::warn!(
            url = %protocol::redact::redact_url(url),
            "TLS to Redis without verifying the server's certificate (insecure_skip_verify): for tests only"
        );
    }
    let with_certs = redis::Client::build_with_tls(
        info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params: None,
        }),
        tls.certificates(),
    )?;
    Ok(with_certs.get_connection_info().clone())
}

/// A [`TlsError`] as the redis-rs error the connection paths already carry.
pub(crate) fn config_error(e: TlsError) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "TLS settings", e.to_string()))
}

/// The name the server's certificate is checked against: the URL's host.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, redis::RedisError> {
    ServerName::try_from(host.to_owned()).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS server name",
            format!("{host}: {e}"),
        ))
    })
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::ReadFile {
        what,
        path: path.to_owned(),
        source,
    })
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::BadPem {
        what,
        path: path.to_owned(),
        expected: "CERTIFICATE",
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&read_file(what, path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block".to_owned()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read_file("client key", path)?).map_err(|e| TlsError::BadPem {
        what: "client key",
        path: path.to_owned(),
        expected: "PRIVATE KEY",
        reason: e.to_string(),
    })
}

/// Appends `der` as one PEM block (redis-rs reads its roots as PEM).
fn push_pem(out: &mut String, label: &str, der: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut encoded = String::with_capacity(der.len() * 4 / 3 + 4);
    for chunk in der.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                encoded.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                encoded.push('=');
            }
        }
    }
    out.push_str(&format!("-----BEGIN {label}-----\n"));
    for line in encoded.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
}

/// The rustls provider: `ring`, which builds with a C compiler alone (no cmake, no system OpenSSL). rustls marks
/// it deprecated for lacking post-quantum key exchange; TLS 1.3 with X25519 is what Redis servers offer today.
#[allow(deprecated)]
fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The verifier of [`TlsOptions::insecure_skip_verify`].
mod insecure {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{ClientConfig, DigitallySignedStruct, Error, SignatureScheme};

    /// Accepts any certificate; still checks that the server holds the key it presents (the handshake's
    /// signatures), which costs nothing and keeps a broken server from looking fine.
    #[derive(Debug)]
    struct AcceptAny(Arc<CryptoProvider>);

    pub(super) fn accept_any(config: &mut ClientConfig) {
        let provider = Arc::new(super::provider());
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(AcceptAny(provider)));
    }

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_round_trips() {
        for der in [vec![1u8], vec![1, 2], vec![1, 2, 3], (0..200u8).collect::<Vec<_>>()] {
            let mut pem = String::new();
            push_pem(&mut pem, "CERTIFICATE", &der);
            let back = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
            assert_eq!(back.as_ref(), der.as_slice());
        }
    }

    #[test]
    fn unusable_settings_are_refused_at_load() {
        let missing = TlsOptions::new().ca_file("/nonexistent/ca.pem");
        assert!(matches!(
            RedisTls::load(&missing),
            Err(TlsError::ReadFile { what: "CA", .. })
        ));
        let half = TlsOptions {
            client_cert_file: Some("/nonexistent/c.pem".into()),
            ..TlsOptions::default()
        };
        assert!(matches!(
            RedisTls::load(&half),
            Err(TlsError::IncompleteIdentity { .. })
        ));
        let named = TlsOptions::new().server_name("redis.internal");
        assert!(matches!(RedisTls::load(&named), Err(TlsError::ServerNameUnsupported)));
    }

    #[test]
    fn tls_settings_need_a_tls_url() {
        let tls = RedisTls::load(&TlsOptions::new()).unwrap();
        let e = connection_info("redis://:pw@127.0.0.1:6379", Some(&tls)).unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
        assert!(!e.to_string().contains("pw"), "{e}");
        assert!(connection_info("rediss://127.0.0.1:6379", Some(&tls)).is_ok());
        assert!(connection_info("redis://127.0.0.1:6379", None).is_ok());
        assert!(is_tls_url("rediss://a:1") && !is_tls_url("redis://a:1"));
    }
}
