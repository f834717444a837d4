//! What a `coordctl` command can fail with, and how it is printed. The admin API itself is
//! [`client_core::admin::AdminClient`].

use client_core::admin::AdminError;
use thiserror::Error;

/// Why a command failed; [`CliError::exit_code`] is the process exit status.
#[derive(Debug, Error)]
pub enum CliError {
    /// The admin call failed: refused by the coordinator, no answer, or an answer that is not its JSON.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// `coordctl` itself refused (a confirmation missing, inconsistent flags).
    #[error("{0}")]
    Refused(String),
}

impl CliError {
    /// The exit status: 1 the coordinator refused or failed, 3 no usable answer, 4 refused by `coordctl`.
    /// (2 is clap's usage error.)
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Admin(AdminError::Api { .. }) => 1,
            CliError::Admin(AdminError::Transport { .. } | AdminError::Decode { .. } | AdminError::Tls { .. }) => 3,
            CliError::Admin(AdminError::Client(_)) | CliError::Refused(_) => 4,
        }
    }
}

/// `err` and its causes, `: `-separated, each said once: a cause whose text the message so far already contains
/// (reqwest, hyper and the OS error often repeat one another) is left out.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::messages::ErrorResponse;

    #[derive(Debug, Error)]
    #[error("{0}")]
    struct Layer(String, #[source] Option<Box<Layer>>);

    fn layers(texts: &[&str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |inner, t| Some(Layer((*t).to_owned(), inner.map(Box::new))))
            .expect("at least one layer")
    }

    #[test]
    fn each_cause_is_printed_once() {
        let e = layers(&[
            "cannot reach the coordinator at http://x",
            "error sending request",
            "client error (Connect)",
            "tcp connect error: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]);
        let chain = error_chain(&e);
        assert_eq!(
            chain,
            "cannot reach the coordinator at http://x: error sending request: client error (Connect): tcp connect \
             error: Connection refused (os error 111)"
        );
        assert_eq!(chain.matches("Connection refused").count(), 1, "{chain}");
    }

    #[test]
    fn exit_codes_distinguish_refusals_from_outages() {
        let api = CliError::Admin(AdminError::Api {
            http: 412,
            body: ErrorResponse {
                status: protocol::Status::RevisionConflict,
                message: "stale".into(),
                member_epoch: None,
                retry_after_ms: None,
            },
        });
        assert_eq!(api.exit_code(), 1);
        assert_eq!(CliError::Refused("no".into()).exit_code(), 4);
    }
}
