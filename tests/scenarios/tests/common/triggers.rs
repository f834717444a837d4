//! Write-boundary faults ([`coord_server::fault`]) that fire on a predicate over the transition and tell the
//! test they fired, and the crashes built on them.

use super::*;

/// A fault that fires on the first writing section of one coordinator matching a predicate at a point, and lets
/// the test wait until it fired.
pub struct Trigger {
    fired: watch::Receiver<usize>,
    /// Transitions it fired on (clones), for assertions.
    pub seen: Arc<Mutex<Vec<Transition>>>,
    _guard: FaultGuard,
}

impl Trigger {
    /// Fires `action` at `point` on the first `times` sections whose transition satisfies `pred`.
    pub fn new(
        coordinator: &coord_server::Coordinator,
        point: Point,
        action: Action,
        times: usize,
        pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
    ) -> Trigger {
        let (tx, rx) = watch::channel(0usize);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_in_hook = Arc::clone(&seen);
        let guard = fault::install(coordinator, move |site: &Site<'_>| {
            if site.point != point || !pred(site.transition) {
                return Action::Continue;
            }
            let mut fire = false;
            tx.send_if_modified(|n| {
                if *n < times {
                    *n += 1;
                    fire = true;
                    true
                } else {
                    false
                }
            });
            if fire {
                seen_in_hook.lock().unwrap().push(site.transition.clone());
                action
            } else {
                Action::Continue
            }
        });
        Trigger {
            fired: rx,
            seen,
            _guard: guard,
        }
    }

    /// Fires once.
    pub fn once(
        coordinator: &coord_server::Coordinator,
        point: Point,
        action: Action,
        pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
    ) -> Trigger {
        Self::new(coordinator, point, action, 1, pred)
    }

    pub fn count(&self) -> usize {
        *self.fired.borrow()
    }

    /// Waits until it fired at least once.
    pub async fn fired(&self) {
        let mut rx = self.fired.clone();
        tokio::time::timeout(DEADLINE, rx.wait_for(|n| *n >= 1))
            .await
            .expect("the fault fired in time")
            .expect("trigger alive");
    }
}

/// Predicates over a transition, for [`Trigger`]s.
pub mod on {
    use super::*;

    pub fn event(t: &Transition, f: impl Fn(&Event) -> bool) -> bool {
        t.events.iter().any(f)
    }

    pub fn joined(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| event(t, |e| matches!(e, Event::MemberJoined(m) if m.as_str() == name))
    }

    pub fn released_by(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| {
            event(
                t,
                |e| matches!(e, Event::ShardReleased { from, .. } if from.as_str() == name),
            )
        }
    }

    pub fn expired(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| event(t, |e| matches!(e, Event::MemberExpired(m) if m.as_str() == name))
    }

    pub fn fenced(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| {
            event(
                t,
                |e| matches!(e, Event::MemberFenced { member, .. } if member.as_str() == name),
            )
        }
    }

    pub fn correction_opened() -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        |t| event(t, |e| matches!(e, Event::CorrectionOpened { .. }))
    }

    pub fn correction_closed() -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        |t| event(t, |e| matches!(e, Event::CorrectionClosed))
    }

    pub fn routing_adopted() -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        |t| event(t, |e| matches!(e, Event::RoutingAdopted { .. }))
    }

    /// A section that renews `name`'s lease (any heartbeat of it, also one that changes nothing else).
    pub fn renews(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| t.renew.iter().any(|(m, _)| m.as_str() == name)
    }
}

/// Crashes coordinator `i` at `point` of its first section matching `pred`, while `during` runs (the request
/// that reaches that section, or nothing when a tick will), then starts a new coordinator on the same URL and the
/// same Redis. `during` is abandoned: its answer never comes (the client would time out).
pub async fn crash_at<F>(
    s: &mut Scenario,
    i: usize,
    point: Point,
    pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
    during: F,
) where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let armed = arm_crash(s, i, point, pred);
    let task = tokio::spawn(during);
    crash_when_fired(s, i, armed, task).await;
}

/// The first half of [`crash_at`], for a test that must cause the section itself after arming (e.g. a Redis
/// rollback that a tick would notice at once): the first section of coordinator `i` matching `pred` will hang at
/// `point`.
pub fn arm_crash(
    s: &Scenario,
    i: usize,
    point: Point,
    pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
) -> Trigger {
    Trigger::once(s.coords[i].coordinator(), point, Action::Hang, pred)
}

/// The second half of [`crash_at`]: once `armed` fired, aborts coordinator `i` and `task`, and starts a new
/// coordinator on the same URL.
pub async fn crash_when_fired<T>(s: &mut Scenario, i: usize, armed: Trigger, task: tokio::task::JoinHandle<T>) {
    armed.fired().await;
    s.coords[i].abort();
    task.abort();
    // Uninstalled before anything else can take the dead coordinator's place (its address could be reused).
    drop(armed);
    s.coords[i].restart().await;
}

/// A heartbeat sent in the background (its answer may never come).
pub fn send_heartbeat(api: &GroupApi, req: HeartbeatRequest) -> impl std::future::Future<Output = ()> + Send + 'static {
    let api = api.clone();
    async move {
        let _ = api.heartbeat(&req).await;
    }
}

/// Heartbeats (a copy of) `m` every heartbeat interval in the background, so its lease holds while the test
/// looks elsewhere. Abort the handle to stop.
pub fn keep_alive(api: &GroupApi, m: &WireMember) -> tokio::task::JoinHandle<()> {
    let api = api.clone();
    let mut m = m.clone();
    tokio::spawn(async move {
        loop {
            m.ok_retrying(&api).await;
            // Real time: a member's heartbeat interval, which its lease is measured against.
            tokio::time::sleep(HEARTBEAT).await;
        }
    })
}
