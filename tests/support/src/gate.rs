//! [`Gate`]: holds handlers inside their message until the test opens it.

use tokio::sync::watch;

/// Lets a test hold handlers inside their message until it opens the gate. Clones share the gate.
#[derive(Clone, Debug)]
pub struct Gate(watch::Sender<bool>);

impl Gate {
    /// An open gate: [`Gate::wait`] returns at once.
    pub fn open() -> Gate {
        Gate(watch::Sender::new(true))
    }

    /// A closed gate: [`Gate::wait`] waits until it is opened.
    pub fn closed() -> Gate {
        Gate(watch::Sender::new(false))
    }

    /// Opens or closes it.
    pub fn set(&self, open: bool) {
        self.0.send_replace(open);
    }

    /// Waits until it is open.
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_closed_gate_holds_until_opened() {
        let gate = Gate::closed();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        gate.set(true);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("opened")
            .expect("task");
        Gate::open().wait().await;
    }
}
