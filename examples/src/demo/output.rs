//! Where the demo writes while it runs: progress bars or plain lines, and log lines that do not garble the bars.

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::io::Write as _;
use std::time::Instant;

/// Where the demo writes while it runs.
pub(crate) struct Output {
    pub(crate) multi: MultiProgress,
    pub(crate) bars: Option<Bars>,
    pub(crate) start: Instant,
    pub(crate) records: u64,
}

pub(crate) struct Bars {
    pub(crate) published: ProgressBar,
    pub(crate) processed: ProgressBar,
    pub(crate) members: ProgressBar,
}

impl Output {
    pub(crate) fn new(multi: MultiProgress, progress: bool, records: u64) -> Output {
        let bars = progress.then(|| {
            let style = ProgressStyle::with_template("{prefix:>10} [{bar:40.cyan/blue}] {pos:>7}/{len:7} {msg}")
                .expect("valid template")
                .progress_chars("=> ");
            let bar = |name: &str| {
                let b = multi.add(ProgressBar::new(records));
                b.set_style(style.clone());
                b.set_prefix(name.to_owned());
                b
            };
            let published = bar("published");
            let processed = bar("processed");
            let members = multi.add(ProgressBar::new_spinner());
            members.set_style(ProgressStyle::with_template("{prefix:>10} {msg}").expect("valid template"));
            members.set_prefix("shards");
            Bars {
                published,
                processed,
                members,
            }
        });
        Output {
            multi,
            bars,
            start: Instant::now(),
            records,
        }
    }

    pub(crate) fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// One event line (above the bars, or on stdout).
    pub(crate) fn event(&self, msg: impl std::fmt::Display) {
        let line = format!("[{:>6.2}s] {msg}", self.secs());
        if self.bars.is_some() {
            let _ = self.multi.println(line);
        } else {
            println!("{line}");
        }
    }

    /// Updates the bars, or prints a status line when `plain_line` (plain mode, once a second).
    /// `(count, seconds)` published and processed: seconds since publishing started, until it ended for the
    /// published count (for the rates).
    pub(crate) fn status(&self, published: (u64, f64), processed: (u64, f64), members: &str, plain_line: bool) {
        let rate = |(n, secs): (u64, f64)| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let ((published_n, _), (processed_n, _)) = (published, processed);
        match &self.bars {
            Some(b) => {
                b.published.set_position(published_n);
                b.published.set_message(format!("{:>7.0} records/s", rate(published)));
                b.processed.set_position(processed_n);
                b.processed.set_message(format!("{:>7.0} records/s", rate(processed)));
                b.members.set_message(members.to_owned());
            }
            None if plain_line => println!(
                "[{:>6.2}s] published {published_n}/{n} processed {processed_n}/{n} | shards: {members}",
                self.secs(),
                n = self.records
            ),
            None => {}
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bars {
            b.published.finish();
            b.processed.finish();
            b.members.finish();
        }
    }
}

/// Log lines go through the progress bars (suspended while one is written), so they do not garble them.
#[derive(Clone)]
pub(crate) struct LogWriter(pub(crate) MultiProgress);

pub(crate) struct LogEvent {
    pub(crate) multi: MultiProgress,
    pub(crate) buf: Vec<u8>,
}

impl std::io::Write for LogEvent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.multi.suspend(|| {
            let _ = std::io::stderr().write_all(&buf);
        });
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogEvent;

    fn make_writer(&'a self) -> LogEvent {
        LogEvent {
            multi: self.0.clone(),
            buf: Vec::new(),
        }
    }
}
