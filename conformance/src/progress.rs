//! Progress of a long run (the suite, `ops`, `math`, the benchmark's sweep): a bar on stderr
//! when it is a terminal, nothing otherwise, so that logs (CI's) keep only their plain
//! per-case lines. `TRIDENT_NO_PROGRESS=1` turns the bar off on a terminal too.
//!
//! A process has one terminal, so the bar drawn is also known process-wide: [`note`] prints a
//! line to stderr above it from code that does not hold it (a benchmark's configuration lines,
//! printed from deep inside each case's sweep).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;

pub struct Progress(Option<ProgressBar>);

/// The bar drawn now, if any (the latest one made; cleared when it is dropped).
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// `line` on stderr, above the bar drawn now (if any), so that the bar is not torn.
pub fn note(line: &str) {
    let bar = SHOWN.lock().ok().and_then(|b| b.clone());
    match bar {
        Some(bar) => bar.suspend(|| eprintln!("{line}")),
        None => eprintln!("{line}"),
    }
}

impl Progress {
    /// A bar of `total` steps named `what`, where stderr is a terminal.
    pub fn new(total: usize, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() || std::env::var_os("TRIDENT_NO_PROGRESS").is_some() {
            return Progress(None);
        }
        let bar = ProgressBar::new(total as u64);
        if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed} (eta {eta}) {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_string());
        if let Ok(mut shown) = SHOWN.lock() {
            *shown = Some(bar.clone());
        }
        Progress(Some(bar))
    }

    /// Runs `print` (a result's line) with the bar out of the way.
    pub fn line(&self, print: impl FnOnce()) {
        match &self.0 {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// One step done; `msg` says which.
    pub fn step(&self, msg: &str) {
        if let Some(bar) = &self.0 {
            bar.set_message(msg.to_string());
            bar.inc(1);
        }
    }

    /// Whether a bar is drawn.
    pub fn shown(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
            if let Ok(mut shown) = SHOWN.lock() {
                *shown = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    /// Without a bar (stderr not a terminal) a result's line prints as it is and steps do
    /// nothing; with one, the line still prints (the bar suspended around it).
    #[test]
    fn lines_print_with_and_without_a_bar() {
        for p in [Progress(None), Progress(Some(indicatif::ProgressBar::hidden()))] {
            let mut printed = false;
            p.line(|| printed = true);
            p.step("one");
            assert!(printed);
        }
        assert!(!Progress(None).shown());
        super::note("a line with no bar drawn");
    }
}
