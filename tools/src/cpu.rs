//! The machine's CPU time, from `/proc/stat` (Linux), so a load run can say
//! how busy the cores were and how much CPU one saga cost across every
//! process on the machine (services, PostgreSQL, the broker, the generator).
//!
//! ```ignore
//! let before = CpuTimes::read();
//! // ... the run ...
//! if let (Some(b), Some(a)) = (before, CpuTimes::read()) { let used = a.since(&b); }
//! ```

/// `/proc/stat` counts in USER_HZ ticks, which the kernel fixes at 100 per
/// second in its ABI on every architecture we run on.
pub(crate) const TICKS_PER_SEC: f64 = 100.0;

/// The aggregate `cpu` line of `/proc/stat` and the number of cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// user + nice + system + irq + softirq + steal, in ticks.
    busy: u64,
    /// busy + idle + iowait, in ticks.
    total: u64,
    pub cores: usize,
}

/// CPU used between two readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUsage {
    /// Busy share of all cores, 0..=1.
    pub busy_fraction: f64,
    /// CPU seconds spent, all cores together.
    pub busy_secs: f64,
    pub cores: usize,
}

impl CpuTimes {
    /// `None` where there is no `/proc/stat` (not Linux) or it cannot be parsed.
    pub fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    pub fn parse(stat: &str) -> Option<Self> {
        let mut lines = stat.lines();
        let first = lines.next()?;
        let mut fields = first.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        // user nice system idle iowait irq softirq steal [guest guest_nice]:
        // guest time is already inside user and nice.
        let v: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        if v.len() < 8 {
            return None;
        }
        let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        let cores = lines
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count();
        Some(Self { busy, total: busy + v[3] + v[4], cores })
    }

    /// What was used from `earlier` to `self`.
    pub fn since(&self, earlier: &Self) -> CpuUsage {
        let busy = self.busy.saturating_sub(earlier.busy);
        let total = self.total.saturating_sub(earlier.total);
        CpuUsage {
            busy_fraction: if total == 0 { 0.0 } else { busy as f64 / total as f64 },
            busy_secs: busy as f64 / TICKS_PER_SEC,
            cores: self.cores,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1000 10 300 5000 40 5 15 30 0 0
cpu0 500 5 150 2500 20 3 7 15 0 0
cpu1 500 5 150 2500 20 2 8 15 0 0
intr 123 0 0
ctxt 456
";

    #[test]
    fn parses_the_aggregate_line_and_counts_the_cores() {
        let t = CpuTimes::parse(STAT).unwrap();
        assert_eq!(t, CpuTimes { busy: 1000 + 10 + 300 + 5 + 15 + 30, total: 1360 + 5000 + 40, cores: 2 });
    }

    #[test]
    fn usage_between_two_readings() {
        let before = CpuTimes::parse(STAT).unwrap();
        let after = CpuTimes { busy: before.busy + 150, total: before.total + 200, cores: 2 };
        let used = after.since(&before);
        assert_eq!(used.busy_fraction, 0.75);
        assert_eq!(used.busy_secs, 1.5);
        assert_eq!(used.cores, 2);
    }

    #[test]
    fn refuses_what_is_not_proc_stat() {
        assert_eq!(CpuTimes::parse(""), None);
        assert_eq!(CpuTimes::parse("intr 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 3\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_reports_its_cores_and_time_moves_forward() {
        let before = CpuTimes::read().expect("/proc/stat");
        // The cores a process may use (a cgroup may allow fewer) are among those online.
        assert!(before.cores >= std::thread::available_parallelism().unwrap().get(), "{before:?}");
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(300) {
            std::hint::black_box(0u64);
        }
        let used = CpuTimes::read().unwrap().since(&before);
        assert!(used.busy_secs > 0.0, "a 300 ms spin shows up as busy time: {used:?}");
    }
}
