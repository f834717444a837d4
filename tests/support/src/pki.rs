//! A test CA and the certificates it signs, made at run time and written as PEM files to a temp directory of
//! their own (never committed keys). For the HTTPS coordinator tests (issue 40).
//!
//! Server certificates name `localhost` and `127.0.0.1`, so `https://127.0.0.1:PORT` verifies.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A CA with its own temp directory: `ca.pem` there, and every certificate it issues.
pub struct TestCa {
    dir: tempfile::TempDir,
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM): what a client trusts, or what a server asks client certificates to chain to.
    pub ca_file: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA named `name` (its common name).
    ///
    /// # Panics
    /// When the key or the certificate cannot be made or written.
    pub fn new(name: &str) -> TestCa {
        let dir = tempfile::tempdir().expect("a temp directory for the test CA");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a self-signed CA certificate");
        let ca_file = dir.path().join("ca.pem");
        write(&ca_file, &issuer.pem());
        TestCa { dir, issuer, ca_file }
    }

    /// The directory holding the CA's files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `localhost` and `127.0.0.1`, written as `<name>.pem` and `<name>.key`.
    ///
    /// # Panics
    /// As [`TestCa::new`].
    pub fn server(&self, name: &str) -> CertFiles {
        let files = CertFiles {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}.key")),
        };
        self.server_into(&files);
        files
    }

    /// A new server certificate (and key) of this CA written over `files`, each file replaced whole (written
    /// beside it, then renamed): a certificate rotation.
    ///
    /// # Panics
    /// As [`TestCa::new`].
    pub fn server_into(&self, files: &CertFiles) {
        self.issue(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            files,
        );
    }

    /// A client certificate named `name`, written as `<name>.pem` and `<name>.key`.
    ///
    /// # Panics
    /// As [`TestCa::new`].
    pub fn client(&self, name: &str) -> CertFiles {
        let files = CertFiles {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}.key")),
        };
        self.issue(vec![name.to_owned()], ExtendedKeyUsagePurpose::ClientAuth, &files);
        files
    }

    fn issue(&self, names: Vec<String>, usage: ExtendedKeyUsagePurpose, files: &CertFiles) {
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "redis-stream-coord test");
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed certificate");
        write(&files.cert, &cert.pem());
        write(&files.key, &key.serialize_pem());
    }
}

/// Writes `text` to `path` whole: beside it first, then renamed over it.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("writing a PEM file");
    std::fs::rename(&tmp, path).expect("renaming a PEM file into place");
}
