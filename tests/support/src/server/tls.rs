//! TLS-only servers ([`crate::RedisServerBuilder::tls`]): the settings, in `redis.conf` and in the harness's own
//! connections. The certificates come from the tests (`test_support::tls::TestPki`, feature `tls`).

use std::path::{Path, PathBuf};

/// A certificate file and its key file (PEM).
#[derive(Debug, Clone)]
pub struct CertPair {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

/// A TLS-only server's settings ([`crate::RedisServerBuilder::tls`]): `port 0`, `tls-port`, its certificate, the
/// CA of the clients' certificates, `tls-auth-clients`; and the CA and client certificate the harness's own
/// connections (readiness, [`crate::RedisServer::connection`]) verify and present with.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate and key (`tls-cert-file`, `tls-key-file`).
    pub cert: CertPair,
    /// `tls-ca-cert-file`: verifies client certificates, and the harness's connections trust it.
    pub ca: PathBuf,
    /// `tls-auth-clients yes` (else `no`).
    pub auth_clients: bool,
    /// The client certificate the harness presents (needed with [`ServerTls::auth_clients`]).
    pub client: Option<CertPair>,
    /// The harness's connections skip verifying the server (set by [`ServerTls::with_cert`]: a test of a bad
    /// certificate still needs its server started).
    pub harness_insecure: bool,
}

impl ServerTls {
    /// Serves `cert` instead (an expired or foreign certificate; the harness then skips verifying it).
    pub fn with_cert(mut self, cert: CertPair) -> ServerTls {
        self.cert = cert;
        self.harness_insecure = true;
        self
    }

    /// redis-rs's certificates for the harness's connections: [`ServerTls::ca`] and [`ServerTls::client`].
    pub fn certificates(&self) -> redis::TlsCertificates {
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|c| redis::ClientTlsConfig {
                client_cert: read(&c.cert),
                client_key: read(&c.key),
            }),
            root_cert: Some(read(&self.ca)),
        }
    }
}

impl ServerTls {
    /// The `redis.conf` lines: TLS only (`port 0`, `tls-port`), replication and the cluster bus over TLS too.
    pub(super) fn config_lines(&self, port: u16, cluster: bool) -> Vec<String> {
        let path = |p: &Path| super::launch::quote(&p.to_string_lossy());
        let mut lines = vec![
            "port 0".to_owned(),
            format!("tls-port {port}"),
            format!("tls-cert-file {}", path(&self.cert.cert)),
            format!("tls-key-file {}", path(&self.cert.key)),
            format!("tls-ca-cert-file {}", path(&self.ca)),
            format!("tls-auth-clients {}", if self.auth_clients { "yes" } else { "no" }),
            "tls-replication yes".to_owned(),
        ];
        if cluster {
            lines.push("tls-cluster yes".to_owned());
        }
        lines
    }
}
