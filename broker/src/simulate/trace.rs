//! Reading job traces. One format so far: the Microsoft Philly training jobs as flattened by
//! DIR-LAB (`u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status`; see
//! `data/traces/README.md`), plain or gzip (recognised by its magic bytes, not its name).
//!
//! A malformed row is an error naming its line (1 is the header) and column; with
//! `skip_bad_rows` it is skipped and counted instead. A row's submit time is the running sum of
//! `interval` over the rows kept.

use anyhow::Context;
use std::io::Read;
use std::path::Path;

/// One Philly job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceJob {
    /// Line in the file (the header is line 1).
    pub line: u64,
    pub submit_s: i64,
    pub gpus: u32,
    pub nodes: u32,
    pub runtime_s: i64,
    pub status: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    /// Rows skipped as malformed (only with `skip_bad_rows`).
    pub skipped: u64,
    /// The first skipped row's error, for the report.
    pub first_skip: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}, column `{column}`: {message}")]
pub struct RowError {
    pub line: u64,
    pub column: String,
    pub message: String,
}

const COLUMNS: [&str; 9] = [
    "u_id",
    "user",
    "gpu_num",
    "cpu_num",
    "node_num",
    "interval",
    "run_time",
    "wall_time",
    "new_status",
];

/// The largest `interval` and `run_time` accepted: ten years, in seconds. Beyond it the
/// simulator's millisecond clock overflowed (found by the `trace_reader` fuzz target).
pub const MAX_SECONDS: i64 = 10 * 365 * 86_400;
/// The largest `gpu_num` and `node_num` accepted.
pub const MAX_COUNT: i64 = 65_536;

/// Reads a Philly trace file, gzip or plain.
pub fn read_philly(path: &Path, skip_bad_rows: bool) -> anyhow::Result<Trace> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = trace_text(raw).with_context(|| format!("in {}", path.display()))?;
    parse_philly(&text, skip_bad_rows).with_context(|| format!("in {}", path.display()))
}

/// The text of a trace file's bytes: gunzipped when they start with gzip's magic bytes.
pub fn trace_text(raw: Vec<u8>) -> anyhow::Result<String> {
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .read_to_string(&mut s)
            .context("decompressing")?;
        Ok(s)
    } else {
        String::from_utf8(raw).context("not UTF-8")
    }
}

/// Parses the text of a Philly trace.
pub fn parse_philly(text: &str, skip_bad_rows: bool) -> Result<Trace, RowError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut records = reader.records();
    let header = match records.next() {
        Some(Ok(h)) => h,
        Some(Err(e)) => return Err(row_error(1, "header", e.to_string())),
        None => return Err(row_error(1, "header", "the file is empty".into())),
    };
    let mut index = [0usize; COLUMNS.len()];
    for (slot, name) in index.iter_mut().zip(COLUMNS) {
        *slot = header
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| row_error(1, name, "missing from the header".into()))?;
    }
    let mut trace = Trace::default();
    let mut submit_s: i64 = 0;
    for (i, record) in records.enumerate() {
        let fallback_line = i as u64 + 2;
        let parsed = match record {
            Ok(r) => {
                let line = r.position().map_or(fallback_line, |p| p.line());
                parse_row(&r, &index, line, header.len())
            }
            Err(e) => {
                let line = e.position().map_or(fallback_line, |p| p.line());
                Err(row_error(line, "row", e.to_string()))
            }
        };
        match parsed {
            Ok((interval, mut job)) => {
                submit_s = submit_s.saturating_add(interval);
                job.submit_s = submit_s;
                trace.jobs.push(job);
            }
            Err(e) if skip_bad_rows => {
                trace.skipped += 1;
                trace.first_skip.get_or_insert_with(|| e.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(trace)
}

fn parse_row(
    r: &csv::StringRecord,
    index: &[usize; COLUMNS.len()],
    line: u64,
    width: usize,
) -> Result<(i64, TraceJob), RowError> {
    if r.len() != width {
        let message = format!("{} fields, the header has {width}", r.len());
        return Err(row_error(line, "row", message));
    }
    let field = |c: usize| r.get(index[c]).unwrap_or("").trim();
    let int = |c: usize, min: i64| -> Result<i64, RowError> {
        let v = field(c);
        let n: i64 = v
            .parse()
            .map_err(|_| row_error(line, COLUMNS[c], format!("`{v}` is not an integer")))?;
        if n < min {
            return Err(row_error(line, COLUMNS[c], format!("{n} is below {min}")));
        }
        Ok(n)
    };
    let at_most = |c: usize, n: i64, max: i64| {
        if n > max {
            return Err(row_error(line, COLUMNS[c], format!("{n} is above {max}")));
        }
        Ok(n)
    };
    let small = |c: usize, n: i64| {
        u32::try_from(at_most(c, n, MAX_COUNT)?)
            .map_err(|_| row_error(line, COLUMNS[c], format!("{n} is too large")))
    };
    let gpus = small(2, int(2, 1)?)?;
    let nodes = small(4, int(4, 1)?)?;
    let interval = at_most(5, int(5, 0)?, MAX_SECONDS)?;
    let runtime_s = at_most(6, int(6, 0)?, MAX_SECONDS)?;
    let status = field(8);
    if status.is_empty() {
        return Err(row_error(line, COLUMNS[8], "is empty".into()));
    }
    let job = TraceJob {
        line,
        submit_s: 0,
        gpus,
        nodes,
        runtime_s,
        status: status.to_owned(),
    };
    Ok((interval, job))
}

fn row_error(line: u64, column: &str, message: String) -> RowError {
    RowError {
        line,
        column: column.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n";

    #[test]
    fn submit_times_are_the_running_sum_of_intervals() {
        let text = format!("{HEADER}0,1,1,0,1,0,100,0,Pass\n1,2,8,0,2,30,50,0,Failed\n");
        let t = parse_philly(&text, false).expect("parses");
        let got: Vec<(i64, u32, u32, i64)> = t
            .jobs
            .iter()
            .map(|j| (j.submit_s, j.gpus, j.nodes, j.runtime_s))
            .collect();
        assert_eq!(got, vec![(0, 1, 1, 100), (30, 8, 2, 50)]);
        assert_eq!(t.jobs[1].line, 3);
    }

    #[test]
    fn a_bad_row_names_its_line_and_column() {
        let text = format!("{HEADER}0,1,1,0,1,0,100,0,Pass\n1,2,eight,0,1,5,50,0,Pass\n");
        let err = parse_philly(&text, false).expect_err("bad gpu_num");
        assert_eq!((err.line, err.column.as_str()), (3, "gpu_num"));
        assert!(
            err.to_string().contains("line 3, column `gpu_num`"),
            "{err}"
        );
        let text = format!("{HEADER}0,1,1,0,1,-4,100,0,Pass\n");
        let err = parse_philly(&text, false).expect_err("negative interval");
        assert_eq!((err.line, err.column.as_str()), (2, "interval"));
        let text = format!("{HEADER}0,1,1,0,1,0\n");
        let err = parse_philly(&text, false).expect_err("short row");
        assert_eq!((err.line, err.column.as_str()), (2, "row"));
    }

    #[test]
    fn bad_rows_are_skipped_and_counted_when_asked() {
        let text =
            format!("{HEADER}0,1,1,0,1,0,100,0,Pass\nx\n2,1,1,0,1,5,1,0,\n3,1,2,0,1,5,9,0,Pass\n");
        let t = parse_philly(&text, true).expect("skips");
        assert_eq!((t.jobs.len(), t.skipped), (2, 2));
        assert_eq!(t.jobs[1].submit_s, 5);
        assert!(t.first_skip.is_some_and(|s| s.contains("line 3")));
    }

    /// Found by the `trace_reader` fuzz target: a `run_time` of 250463532389591 s overflowed
    /// the simulator's clock (`remaining_s * 1000`).
    #[test]
    fn absurd_runtimes_intervals_and_counts_are_row_errors() {
        for (row, column) in [
            ("0,1,1,0,1,0,250463532389591,0,Pass", "run_time"),
            ("0,1,1,0,1,315360001,1,0,Pass", "interval"),
            ("0,1,65537,0,1,0,1,0,Pass", "gpu_num"),
            ("0,1,1,0,4294967296,0,1,0,Pass", "node_num"),
        ] {
            let err = parse_philly(&format!("{HEADER}{row}\n"), false).expect_err(row);
            assert_eq!((err.line, err.column.as_str()), (2, column), "{err}");
        }
        let ok = format!("{HEADER}0,1,65536,0,1,315360000,315360000,0,Pass\n");
        assert_eq!(
            parse_philly(&ok, false).expect("at the limits").jobs.len(),
            1
        );
    }

    #[test]
    fn a_missing_column_is_named() {
        let err = parse_philly("u_id,user\n", false).expect_err("no gpu_num");
        assert_eq!((err.line, err.column.as_str()), (1, "gpu_num"));
    }
}
