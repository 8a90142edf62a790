//! Reading job traces, in four formats (`--trace-format`), each plain or gzip (recognised by
//! its magic bytes, not its name). Every format gives the same [`TraceJob`]s: the submission in
//! seconds since the trace's first one, in order; GPUs, nodes, the true run time, the final
//! status in the format's own words; and the user, the job's name and the run time the user
//! asked for where the format has them.
//!
//! - `philly`: Microsoft Philly's training jobs as flattened by DIR-LAB
//!   (`u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status`; see
//!   `data/traces/README.md`). A row's submission is the running sum of `interval`. Its
//!   `wall_time` is always 0 ("do not use"): not read, so no requested run time. A `gpu_num` of
//!   0 is an error.
//! - `bluewaters`: DIR-LAB's NCSA Blue Waters jobs, the same columns. `wall_time` is the run-time
//!   limit the user asked for (`requested_s`; 0 is none). A row with `gpu_num` 0 is a CPU job:
//!   neither a job nor an error, it is counted in [`Trace::non_gpu_rows`], and its `interval`
//!   still advances the clock (only `gpu_num` and `interval` are read from it).
//! - `helios`: SenseTime's Helios traces (SC '21; `cluster_log.csv`, published columns
//!   `job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue`,
//!   in any order, and `jobname` where a release has it). Read: `submit_time` (a date-time,
//!   `2020-04-01 00:00:05`, with or without fractional seconds or a `T`; or epoch seconds),
//!   `duration` (seconds), `gpu_num`, `state`; `node_num`, `user` and `jobname` when present
//!   (1 node without the column). No requested run time. Numbers may be written as decimals
//!   (`4.0`, as pandas writes them): counts must be whole, durations are rounded up. `gpu_num`
//!   0 is a CPU job, counted in `non_gpu_rows` (only `gpu_num` and `submit_time` are read).
//! - `swf`: the Standard Workload Format of the Parallel Workloads Archive: 18 fields separated
//!   by white space per line, `;` starts a comment (the header), -1 is unknown. Read: field 2
//!   (submit time, s), 4 (run time), 5 (allocated processors, else 8, requested processors),
//!   9 (requested time: `requested_s`), 11 (status: 1 `Completed`, 0 `Failed`, 5 `Cancelled`,
//!   other codes as their number), 12 (user id: `user`), 14 (executable number: `name`). SWF
//!   has no GPU column: **each processor is read as one GPU**, and no scaling (processors per
//!   GPU) is applied. It has no node count either: every job is 1 node (the scenario folds it
//!   onto its largest node, keeping its GPU-hours). A job whose submit time, run time or
//!   processors are unknown (-1; 0 processors) cannot be replayed: it is not an error, it is
//!   counted in [`Trace::unusable_rows`] (real logs have many: jobs cancelled before they
//!   started).
//!
//! `helios` and `swf` give absolute submit times: a job's `submit_s` is counted from the earliest
//! submission of any row read (GPU job or not, so the first job may arrive after 0), and jobs are
//! sorted by it (ties keep file order; each keeps its line). A submission more than
//! [`MAX_SECONDS`] after that is an error of its row.
//!
//! A malformed row is an error naming its line (1 is the first line, a CSV header included) and
//! column as the format names it (`gpu_num`, `submit_time`, `field 4 (run time)`); with
//! `skip_bad_rows` it is skipped and counted instead. A skipped `philly` or `bluewaters` row does
//! not advance the clock (its `interval` may be what is wrong), so the rows after it arrive that
//! much earlier.

use anyhow::Context;
use chrono::NaiveDateTime;
use std::io::Read;
use std::path::Path;

/// Which columns a trace file has (`switchyard simulate --trace-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// Microsoft Philly's jobs as flattened by DIR-LAB (CSV).
    Philly,
    /// NCSA Blue Waters' jobs as flattened by DIR-LAB: Philly's columns, with the requested
    /// wall time, and CPU jobs (`gpu_num` 0) left out.
    Bluewaters,
    /// SenseTime Helios' `cluster_log.csv`.
    Helios,
    /// The Parallel Workloads Archive's Standard Workload Format (processors read as GPUs).
    Swf,
}

impl TraceFormat {
    pub const ALL: [TraceFormat; 4] = [
        TraceFormat::Philly,
        TraceFormat::Bluewaters,
        TraceFormat::Helios,
        TraceFormat::Swf,
    ];
}

/// One job of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceJob {
    /// Line in the file (1 is the first, a CSV header included).
    pub line: u64,
    /// Seconds since the trace's first submission.
    pub submit_s: i64,
    pub gpus: u32,
    pub nodes: u32,
    /// What the job really ran, start to end.
    pub runtime_s: i64,
    /// The final state, in the format's own words (`Pass`, `COMPLETED`, `Cancelled`, …).
    pub status: String,
    /// The trace's user id ("" when it has none).
    pub user: String,
    /// The job's name, where the format has one (Helios' `jobname`, SWF's executable number).
    pub name: Option<String>,
    /// The run time the user asked for (Blue Waters' `wall_time`, SWF's requested time), when
    /// the format has it and the row gives one.
    pub requested_s: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    /// Rows skipped as malformed (only with `skip_bad_rows`).
    pub skipped: u64,
    /// The first skipped row's error, for the report.
    pub first_skip: Option<String>,
    /// Well-formed rows of CPU-only jobs (`gpu_num` 0; Blue Waters, Helios): not replayed.
    pub non_gpu_rows: u64,
    /// Well-formed rows that cannot be replayed for lack of a submit time, run time or size
    /// (SWF's -1, "unknown").
    pub unusable_rows: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}, column `{column}`: {message}")]
pub struct RowError {
    pub line: u64,
    pub column: String,
    pub message: String,
}

/// The largest run time (and `interval`, and submission after the trace's first) accepted:
/// ten years, in seconds. Beyond it the simulator's millisecond clock overflowed (found by the
/// `trace_reader` fuzz target).
pub const MAX_SECONDS: i64 = 10 * 365 * 86_400;
/// The largest GPU and node counts accepted.
pub const MAX_COUNT: i64 = 65_536;
/// The largest absolute submit time accepted (epoch seconds of 9999-12-31 23:59:59).
const MAX_EPOCH_S: i64 = 253_402_300_799;

/// Reads a trace file of `format`, gzip or plain.
pub fn read(path: &Path, format: TraceFormat, skip_bad_rows: bool) -> anyhow::Result<Trace> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = trace_text(raw).with_context(|| format!("in {}", path.display()))?;
    parse(&text, format, skip_bad_rows).with_context(|| format!("in {}", path.display()))
}

/// Parses the text of a trace of `format`.
pub fn parse(text: &str, format: TraceFormat, skip_bad_rows: bool) -> Result<Trace, RowError> {
    match format {
        TraceFormat::Philly => parse_dirlab(text, false, skip_bad_rows),
        TraceFormat::Bluewaters => parse_dirlab(text, true, skip_bad_rows),
        TraceFormat::Helios => parse_helios(text, skip_bad_rows),
        TraceFormat::Swf => parse_swf(text, skip_bad_rows),
    }
}

/// Reads a Philly trace file, gzip or plain.
pub fn read_philly(path: &Path, skip_bad_rows: bool) -> anyhow::Result<Trace> {
    read(path, TraceFormat::Philly, skip_bad_rows)
}

/// Parses the text of a Philly trace.
pub fn parse_philly(text: &str, skip_bad_rows: bool) -> Result<Trace, RowError> {
    parse(text, TraceFormat::Philly, skip_bad_rows)
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

/// A malformed row: an error, or with `skip_bad_rows` skipped and counted.
fn skip_or_fail(trace: &mut Trace, skip_bad_rows: bool, e: RowError) -> Result<(), RowError> {
    if !skip_bad_rows {
        return Err(e);
    }
    trace.skipped += 1;
    trace.first_skip.get_or_insert_with(|| e.to_string());
    Ok(())
}

/// A CSV trace's header and its rows, each with its line; a row whose width differs from the
/// header's is an error.
type CsvRows<'a> = Box<dyn Iterator<Item = Result<(u64, csv::StringRecord), RowError>> + 'a>;

fn csv_rows(text: &str) -> Result<(csv::StringRecord, CsvRows<'_>), RowError> {
    let mut records = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes())
        .into_records();
    let header = match records.next() {
        Some(Ok(h)) => h,
        Some(Err(e)) => return Err(row_error(1, "header", e.to_string())),
        None => return Err(row_error(1, "header", "the file is empty".into())),
    };
    let width = header.len();
    let mut lines = LineCounter::new(text);
    let rows = records.enumerate().map(move |(i, record)| {
        let fallback_line = i as u64 + 2;
        match record {
            Ok(r) => {
                let line = r.position().map_or(fallback_line, |p| lines.at(p.byte()));
                if r.len() != width {
                    let message = format!("{} fields, the header has {width}", r.len());
                    return Err(row_error(line, "row", message));
                }
                Ok((line, r))
            }
            Err(e) => {
                let line = e.position().map_or(fallback_line, |p| lines.at(p.byte()));
                Err(row_error(line, "row", e.to_string()))
            }
        }
    });
    Ok((header, Box::new(rows)))
}

/// The line a CSV record starts on, from its byte offset. (The csv reader's own line count is
/// one short in a file with `\r\n` line ends, as the shared traces have: a record's position
/// is taken at the `\n` that ends the previous line.) Offsets only grow: counted once.
struct LineCounter<'a> {
    text: &'a [u8],
    offset: usize,
    line: u64,
}

impl<'a> LineCounter<'a> {
    fn new(text: &'a str) -> Self {
        LineCounter {
            text: text.as_bytes(),
            offset: 0,
            line: 1,
        }
    }

    fn at(&mut self, byte: u64) -> u64 {
        let mut end = usize::try_from(byte)
            .unwrap_or(usize::MAX)
            .min(self.text.len());
        while self
            .text
            .get(end)
            .is_some_and(|b| matches!(b, b'\r' | b'\n'))
        {
            end += 1;
        }
        if end > self.offset {
            let newlines = self.text[self.offset..end].iter().filter(|&&b| b == b'\n');
            self.line += newlines.count() as u64;
            self.offset = end;
        }
        self.line
    }
}

/// Where the header names `name` (a byte-order mark and spaces ignored).
fn column(header: &csv::StringRecord, name: &str) -> Option<usize> {
    header
        .iter()
        .position(|h| h.trim_start_matches('\u{feff}').trim() == name)
}

fn required_column(header: &csv::StringRecord, name: &str) -> Result<usize, RowError> {
    column(header, name).ok_or_else(|| row_error(1, name, "missing from the header".into()))
}

const DIRLAB_COLUMNS: [&str; 9] = [
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

/// Philly and Blue Waters: submissions are the running sum of `interval`.
fn parse_dirlab(text: &str, bluewaters: bool, skip_bad_rows: bool) -> Result<Trace, RowError> {
    let (header, rows) = csv_rows(text)?;
    let mut index = [0usize; DIRLAB_COLUMNS.len()];
    for (slot, name) in index.iter_mut().zip(DIRLAB_COLUMNS) {
        *slot = required_column(&header, name)?;
    }
    let mut trace = Trace::default();
    let mut submit_s: i64 = 0;
    for row in rows {
        match row.and_then(|(line, r)| dirlab_row(&r, &index, line, bluewaters)) {
            Ok((interval, job)) => {
                submit_s = submit_s.saturating_add(interval);
                match job {
                    Some(mut job) => {
                        job.submit_s = submit_s;
                        trace.jobs.push(job);
                    }
                    None => trace.non_gpu_rows += 1,
                }
            }
            Err(e) => skip_or_fail(&mut trace, skip_bad_rows, e)?,
        }
    }
    Ok(trace)
}

/// A row's `interval` and its job (`None`: a Blue Waters CPU job).
fn dirlab_row(
    r: &csv::StringRecord,
    index: &[usize; DIRLAB_COLUMNS.len()],
    line: u64,
    bluewaters: bool,
) -> Result<(i64, Option<TraceJob>), RowError> {
    let field = |c: usize| r.get(index[c]).unwrap_or("").trim();
    let int = |c: usize, min: i64, max: i64| {
        let n = integer(line, DIRLAB_COLUMNS[c], field(c))?;
        in_range(line, DIRLAB_COLUMNS[c], n, min, max)
    };
    let gpus = match int(2, i64::from(!bluewaters), MAX_COUNT) {
        Err(mut e) if field(2) == "0" => {
            e.message
                .push_str(" (a CPU job? --trace-format bluewaters leaves those out)");
            return Err(e);
        }
        g => g?,
    };
    if gpus == 0 {
        return Ok((int(5, 0, MAX_SECONDS)?, None));
    }
    let nodes = int(4, 1, MAX_COUNT)?;
    let interval = int(5, 0, MAX_SECONDS)?;
    let runtime_s = int(6, 0, MAX_SECONDS)?;
    let requested_s = if bluewaters {
        Some(int(7, 0, MAX_SECONDS)?).filter(|&s| s > 0)
    } else {
        None
    };
    let status = non_empty(line, DIRLAB_COLUMNS[8], field(8))?;
    let job = TraceJob {
        line,
        submit_s: 0,
        gpus: count(line, DIRLAB_COLUMNS[2], gpus)?,
        nodes: count(line, DIRLAB_COLUMNS[4], nodes)?,
        runtime_s,
        status,
        user: field(1).to_owned(),
        name: None,
        requested_s,
    };
    Ok((interval, Some(job)))
}

/// Helios' columns this reader uses: the first four are required.
struct HeliosColumns {
    submit: usize,
    duration: usize,
    gpus: usize,
    state: usize,
    nodes: Option<usize>,
    user: Option<usize>,
    name: Option<usize>,
}

fn parse_helios(text: &str, skip_bad_rows: bool) -> Result<Trace, RowError> {
    let (header, rows) = csv_rows(text)?;
    let columns = HeliosColumns {
        submit: required_column(&header, "submit_time")?,
        duration: required_column(&header, "duration")?,
        gpus: required_column(&header, "gpu_num")?,
        state: required_column(&header, "state")?,
        nodes: column(&header, "node_num"),
        user: column(&header, "user"),
        name: column(&header, "jobname"),
    };
    let mut trace = Trace::default();
    let mut absolute = Absolute::default();
    for row in rows {
        match row.and_then(|(line, r)| helios_row(&r, &columns, line)) {
            Ok(row) => absolute.row(&mut trace, row),
            Err(e) => skip_or_fail(&mut trace, skip_bad_rows, e)?,
        }
    }
    absolute.finish(&mut trace, "submit_time", skip_bad_rows)?;
    Ok(trace)
}

fn helios_row(r: &csv::StringRecord, c: &HeliosColumns, line: u64) -> Result<Row, RowError> {
    let field = |i: usize| r.get(i).unwrap_or("").trim();
    let submit = date_time(line, "submit_time", field(c.submit))?;
    let gpus = helios_number(line, "gpu_num", field(c.gpus), true)?;
    let gpus = in_range(line, "gpu_num", gpus, 0, MAX_COUNT)?;
    if gpus == 0 {
        return Ok(Row::NonGpu(submit));
    }
    let nodes = match c.nodes {
        Some(i) => {
            let n = helios_number(line, "node_num", field(i), true)?;
            in_range(line, "node_num", n, 1, MAX_COUNT)?
        }
        None => 1,
    };
    let runtime_s = helios_number(line, "duration", field(c.duration), false)?;
    let runtime_s = in_range(line, "duration", runtime_s, 0, MAX_SECONDS)?;
    let job = TraceJob {
        line,
        submit_s: 0,
        gpus: count(line, "gpu_num", gpus)?,
        nodes: count(line, "node_num", nodes)?,
        runtime_s,
        status: non_empty(line, "state", field(c.state))?,
        user: c.user.map_or("", field).to_owned(),
        name: c
            .name
            .map(field)
            .filter(|n| !n.is_empty())
            .map(str::to_owned),
        requested_s: None,
    };
    Ok(Row::Job(submit, job))
}

/// A Helios number: an integer, or a decimal (pandas writes `4.0` in a column with a gap).
/// `whole`: a count, whose decimal must be whole; otherwise seconds, rounded up.
fn helios_number(line: u64, column: &str, v: &str, whole: bool) -> Result<i64, RowError> {
    if let Ok(n) = v.parse::<i64>() {
        return Ok(n);
    }
    let not_a_number = || row_error(line, column, format!("`{v}` is not a number"));
    let x: f64 = v.parse().map_err(|_| not_a_number())?;
    if !x.is_finite() {
        return Err(not_a_number());
    }
    if whole && x.fract() != 0.0 {
        return Err(row_error(
            line,
            column,
            format!("`{v}` is not a whole number"),
        ));
    }
    if x.abs() > 1e18 {
        return Err(row_error(line, column, format!("`{v}` is out of range")));
    }
    Ok(x.ceil() as i64)
}

/// An absolute time: `2020-04-01 00:00:05` (fractional seconds and a `T` allowed; no time zone,
/// read as UTC: only differences matter) or epoch seconds.
fn date_time(line: u64, column: &str, v: &str) -> Result<i64, RowError> {
    if let Ok(n) = v.parse::<i64>() {
        return in_range(line, column, n, 0, MAX_EPOCH_S);
    }
    ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(v, f).ok())
        .map(|t| t.and_utc().timestamp())
        .ok_or_else(|| {
            let message =
                format!("`{v}` is neither a date-time (`2020-04-01 00:00:05`) nor epoch seconds");
            row_error(line, column, message)
        })
}

const SWF_FIELDS: [&str; 18] = [
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job number",
    "think time",
];

fn parse_swf(text: &str, skip_bad_rows: bool) -> Result<Trace, RowError> {
    let mut trace = Trace::default();
    let mut absolute = Absolute::default();
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        let text = raw.trim();
        if text.is_empty() || text.starts_with(';') {
            continue;
        }
        match swf_row(text, line) {
            Ok(row) => absolute.row(&mut trace, row),
            Err(e) => skip_or_fail(&mut trace, skip_bad_rows, e)?,
        }
    }
    absolute.finish(&mut trace, &swf_column(1), skip_bad_rows)?;
    Ok(trace)
}

/// `field 4 (run time)`: SWF's 1-based field number and name.
fn swf_column(i: usize) -> String {
    format!("field {} ({})", i + 1, SWF_FIELDS[i])
}

fn swf_row(text: &str, line: u64) -> Result<Row, RowError> {
    let f: Vec<&str> = text.split_whitespace().collect();
    if f.len() != SWF_FIELDS.len() {
        let message = format!("{} fields, SWF has {}", f.len(), SWF_FIELDS.len());
        return Err(row_error(line, "row", message));
    }
    // A field at most `max`, or -1: unknown.
    let get = |i: usize, max: i64| -> Result<Option<i64>, RowError> {
        let column = swf_column(i);
        let n = integer(line, &column, f[i])?;
        if n == -1 {
            return Ok(None);
        }
        in_range(line, &column, n, 0, max).map(Some)
    };
    let submit = get(1, MAX_EPOCH_S)?;
    let runtime_s = get(3, MAX_SECONDS)?;
    let allocated = get(4, MAX_COUNT)?;
    let asked = get(7, MAX_COUNT)?;
    let requested_s = get(8, MAX_SECONDS)?.filter(|&s| s > 0);
    let status = get(10, i64::MAX)?;
    let user = get(11, i64::MAX)?;
    let name = get(13, i64::MAX)?;
    let procs = allocated.filter(|&p| p > 0).or(asked.filter(|&p| p > 0));
    let (Some(submit), Some(runtime_s), Some(procs)) = (submit, runtime_s, procs) else {
        return Ok(Row::Unusable(submit));
    };
    let status = match status {
        Some(1) => "Completed".to_owned(),
        Some(0) => "Failed".to_owned(),
        Some(5) => "Cancelled".to_owned(),
        Some(n) => n.to_string(),
        None => "unknown".to_owned(),
    };
    let job = TraceJob {
        line,
        submit_s: 0,
        gpus: count(line, &swf_column(4), procs)?,
        nodes: 1,
        runtime_s,
        status,
        user: user.map(|u| u.to_string()).unwrap_or_default(),
        name: name.map(|n| n.to_string()),
        requested_s,
    };
    Ok(Row::Job(submit, job))
}

/// A well-formed row of a format with absolute submit times.
enum Row {
    /// A job and its absolute submission.
    Job(i64, TraceJob),
    /// A CPU job's submission.
    NonGpu(i64),
    /// A job without a submit time, run time or size; its submission if known.
    Unusable(Option<i64>),
}

/// The jobs of a format with absolute submit times, before they are made relative and sorted.
#[derive(Default)]
struct Absolute {
    /// The earliest submission of any row read.
    origin: Option<i64>,
    jobs: Vec<(i64, TraceJob)>,
}

impl Absolute {
    fn row(&mut self, trace: &mut Trace, row: Row) {
        let submit = match row {
            Row::Job(s, job) => {
                self.jobs.push((s, job));
                Some(s)
            }
            Row::NonGpu(s) => {
                trace.non_gpu_rows += 1;
                Some(s)
            }
            Row::Unusable(s) => {
                trace.unusable_rows += 1;
                s
            }
        };
        if let Some(s) = submit {
            self.origin = Some(self.origin.map_or(s, |o| o.min(s)));
        }
    }

    fn finish(mut self, trace: &mut Trace, column: &str, skip: bool) -> Result<(), RowError> {
        // Stable: ties keep file order.
        self.jobs.sort_by_key(|(s, _)| *s);
        let origin = self.origin.unwrap_or(0);
        for (submit, mut job) in self.jobs {
            let after = submit - origin;
            if after > MAX_SECONDS {
                let message = format!(
                    "{after} s after the trace's first submission, above {MAX_SECONDS} (10 years)"
                );
                skip_or_fail(trace, skip, row_error(job.line, column, message))?;
                continue;
            }
            job.submit_s = after;
            trace.jobs.push(job);
        }
        Ok(())
    }
}

fn integer(line: u64, column: &str, v: &str) -> Result<i64, RowError> {
    v.parse()
        .map_err(|_| row_error(line, column, format!("`{v}` is not an integer")))
}

fn in_range(line: u64, column: &str, n: i64, min: i64, max: i64) -> Result<i64, RowError> {
    if n < min {
        return Err(row_error(line, column, format!("{n} is below {min}")));
    }
    if n > max {
        return Err(row_error(line, column, format!("{n} is above {max}")));
    }
    Ok(n)
}

fn count(line: u64, column: &str, n: i64) -> Result<u32, RowError> {
    u32::try_from(n).map_err(|_| row_error(line, column, format!("{n} is too large")))
}

fn non_empty(line: u64, column: &str, v: &str) -> Result<String, RowError> {
    if v.is_empty() {
        return Err(row_error(line, column, "is empty".into()));
    }
    Ok(v.to_owned())
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
        let got: Vec<_> = t
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

    fn file_text(path: &str) -> String {
        let raw = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        trace_text(raw).expect("the file's text")
    }

    #[test]
    fn the_formats_are_named_as_the_flag_spells_them() {
        use clap::ValueEnum;
        for (name, format) in ["philly", "bluewaters", "helios", "swf"]
            .into_iter()
            .zip(TraceFormat::ALL)
        {
            assert_eq!(TraceFormat::from_str(name, false), Ok(format));
        }
        assert_eq!(TraceFormat::value_variants(), TraceFormat::ALL);
    }

    /// The shared traces end their lines with `\r\n`: found with the Blue Waters file, where
    /// the csv reader's own count put its first data row on line 1.
    #[test]
    fn lines_are_counted_with_crlf_line_ends() {
        let text = format!("{HEADER}0,1,1,0,1,0,100,0,Pass\n1,2,eight,0,1,5,50,0,Pass\n")
            .replace('\n', "\r\n");
        let err = parse_philly(&text, false).expect_err("bad gpu_num");
        assert_eq!((err.line, err.column.as_str()), (3, "gpu_num"));
        let t = parse_philly(&text.replace("eight", "8"), false).expect("parses");
        assert_eq!(t.jobs.iter().map(|j| j.line).collect::<Vec<_>>(), [2, 3]);
    }

    #[test]
    fn philly_reads_the_user_and_no_requested_time() {
        let text = format!("{HEADER}0,17,1,0,1,0,100,3600,Pass\n");
        let t = parse(&text, TraceFormat::Philly, false).expect("parses");
        let j = &t.jobs[0];
        assert_eq!(
            (j.user.as_str(), j.name.as_deref(), j.requested_s),
            ("17", None, None)
        );
        assert_eq!((t.non_gpu_rows, t.unusable_rows), (0, 0));
    }

    #[test]
    fn philly_names_a_cpu_job_as_the_likely_cause() {
        let err = parse(
            &format!("{HEADER}0,1,0,32,1,0,100,0,Pass\n"),
            TraceFormat::Philly,
            false,
        )
        .expect_err("gpu_num 0");
        assert_eq!((err.line, err.column.as_str()), (2, "gpu_num"));
        assert!(err.message.contains("bluewaters"), "{err}");
    }

    /// CPU rows are counted, not kept, and their intervals still move the clock: the GPU job
    /// after two CPU jobs arrives at the sum of all three intervals.
    #[test]
    fn bluewaters_counts_cpu_rows_and_they_still_advance_time() {
        let text = format!(
            "{HEADER}0,1,0,86464,2702,0,233,43200,Pass\n\
             1,1,0,86464,2702,400,242,43200,Pass\n\
             2,2,12,0,12,4000,57845,86400,Pass\n\
             3,2,0,32,1,7,5,0,Failed\n\
             4,3,1,0,1,3,100,0,Killed\n"
        );
        let t = parse(&text, TraceFormat::Bluewaters, false).expect("parses");
        assert_eq!(t.non_gpu_rows, 3);
        let got: Vec<_> = t
            .jobs
            .iter()
            .map(|j| {
                (
                    j.line,
                    j.submit_s,
                    j.gpus,
                    j.runtime_s,
                    j.requested_s,
                    j.user.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (4, 4400, 12, 57845, Some(86400), "2"),
                (6, 4410, 1, 100, None, "3"),
            ]
        );
    }

    #[test]
    fn bluewaters_bad_rows_name_their_line_and_column() {
        for (row, column) in [
            ("0,1,1,0,1,0,100,-5,Pass", "wall_time"),
            ("0,1,1,0,1,0,100,315360001,Pass", "wall_time"),
            ("0,1,1,0,1,0,100,long,Pass", "wall_time"),
            ("0,1,0,32,1,soon,100,60,Pass", "interval"),
            ("0,1,-1,0,1,0,100,60,Pass", "gpu_num"),
        ] {
            let text = format!("{HEADER}0,1,1,0,1,0,1,1,Pass\n{row}\n");
            let err = parse(&text, TraceFormat::Bluewaters, false).expect_err(row);
            assert_eq!((err.line, err.column.as_str()), (3, column), "{err}");
        }
    }

    /// The shared Blue Waters file (`data/traces/README.md`): 3,403 GPU jobs, the rest CPU
    /// jobs, every GPU job with the wall time its user asked for.
    #[test]
    fn the_shared_blue_waters_file_gives_its_gpu_jobs_with_requested_times() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/data/traces/bluewaters_dirlab15k_jobs.csv.gz"
        );
        let t = read(Path::new(path), TraceFormat::Bluewaters, false).expect("reads");
        assert_eq!((t.jobs.len(), t.non_gpu_rows, t.skipped), (3403, 11_597, 0));
        assert!(t.jobs.iter().all(|j| j.requested_s.is_some_and(|s| s > 0)));
        // Rows 2 and 3 (line 2 and 3) are CPU jobs: the first GPU job arrives after them.
        assert_eq!(
            (t.jobs[0].line, t.jobs[0].submit_s),
            (4, 403_625 + 4_488_422)
        );
        let over = t
            .jobs
            .iter()
            .filter(|j| j.requested_s.is_some_and(|r| j.runtime_s > r))
            .count();
        assert_eq!(over, 477, "the README's jobs that ran past their request");
        let err = read(Path::new(path), TraceFormat::Philly, false).expect_err("CPU jobs");
        assert!(
            format!("{err:#}").contains("line 2, column `gpu_num`"),
            "{err:#}"
        );
    }

    const HELIOS_HEADER: &str = "job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n";

    /// Submissions are made relative to the earliest row's (a CPU job's here) and sorted; each
    /// job keeps its line.
    #[test]
    fn helios_rows_are_sorted_and_relative_to_the_first_submission() {
        let text = format!(
            "{HELIOS_HEADER}\
             12,uA,vc1,train.py,8,64,1,COMPLETED,2020-04-01 00:10:00,2020-04-01 00:10:00,2020-04-01 01:10:00,3600,0\n\
             11,uB,vc1,,0,4,1,COMPLETED,2020-04-01 00:00:05,2020-04-01 00:00:05,2020-04-01 00:00:09,4,0\n\
             13,uB,vc2,eval,2.0,8,1.0,FAILED,2020-04-01T00:05:00.5,,,12.5,0\n\
             14,uC,vc2,big,32,256,4,CANCELLED,1585700105,,,600,0\n"
        );
        let t = parse(&text, TraceFormat::Helios, false).expect("parses");
        assert_eq!((t.non_gpu_rows, t.unusable_rows), (1, 0));
        let got: Vec<_> = t
            .jobs
            .iter()
            .map(|j| {
                (
                    j.line,
                    j.submit_s,
                    j.gpus,
                    j.nodes,
                    j.runtime_s,
                    j.status.as_str(),
                    j.user.as_str(),
                    j.name.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (4, 295, 2, 1, 13, "FAILED", "uB", Some("eval")),
                (2, 595, 8, 1, 3600, "COMPLETED", "uA", Some("train.py")),
                // 1585700105 is 2020-04-01 00:15:05 UTC.
                (5, 900, 32, 4, 600, "CANCELLED", "uC", Some("big")),
            ]
        );
        assert!(t.jobs.iter().all(|j| j.requested_s.is_none()));
    }

    #[test]
    fn helios_needs_four_columns_and_names_bad_cells() {
        let err = parse(
            "job_id,user,gpu_num,state,duration\n",
            TraceFormat::Helios,
            false,
        )
        .expect_err("no submit_time");
        assert_eq!((err.line, err.column.as_str()), (1, "submit_time"));
        // Without node_num, user and jobname: one node, no user, no name.
        let t = parse(
            "submit_time,duration,gpu_num,state\n2020-04-01 00:00:00,60,4,COMPLETED\n",
            TraceFormat::Helios,
            false,
        )
        .expect("the four columns are enough");
        let j = &t.jobs[0];
        assert_eq!((j.nodes, j.user.as_str(), j.name.as_deref()), (1, "", None));
        let ok = "1,u,vc,n,1,1,1,COMPLETED,2020-04-01 00:00:00,,,60,0";
        for (row, column) in [
            ("2,u,vc,n,1,1,1,COMPLETED,April 1st,,,60,0", "submit_time"),
            (
                "2,u,vc,n,1,1,1,COMPLETED,2020-04-01 25:00:00,,,60,0",
                "submit_time",
            ),
            (
                "2,u,vc,n,1.5,1,1,COMPLETED,2020-04-01 00:00:00,,,60,0",
                "gpu_num",
            ),
            (
                "2,u,vc,n,1,1,0,COMPLETED,2020-04-01 00:00:00,,,60,0",
                "node_num",
            ),
            (
                "2,u,vc,n,1,1,1,COMPLETED,2020-04-01 00:00:00,,,,0",
                "duration",
            ),
            (
                "2,u,vc,n,1,1,1,COMPLETED,2020-04-01 00:00:00,,,NaN,0",
                "duration",
            ),
            ("2,u,vc,n,1,1,1,,2020-04-01 00:00:00,,,60,0", "state"),
            (
                "2,u,vc,n,1,1,1,COMPLETED,2031-04-01 00:00:00,,,60,0",
                "submit_time",
            ),
            ("2,u,vc,n,1,1,1,COMPLETED", "row"),
        ] {
            let text = format!("{HELIOS_HEADER}{ok}\n{row}\n");
            let err = parse(&text, TraceFormat::Helios, false).expect_err(row);
            assert_eq!((err.line, err.column.as_str()), (3, column), "{err}");
            let t = parse(&text, TraceFormat::Helios, true).expect("skips");
            assert_eq!((t.jobs.len(), t.skipped), (1, 1), "{row}");
        }
    }

    const SWF: &str = "\
; Version: 2.2
; Computer: test
; UnixStartTime: 1585699200
; MaxProcs: 128
;
    1      0   12   3612   16  3598 -1   16  7200 -1  1  3  1  1  1  1 -1 -1
    2     45    0     86   -1    80 -1    4   600 -1  0  5  2 -1  1  1 -1 -1
    3     30  420     -1   -1    -1 -1   32  3600 -1  5  3  1  1  1  1 -1 -1

    4     20    3    100    2    90 -1    2    -1 -1  5 -1  2  7  1  1 -1 -1
";

    #[test]
    fn swf_reads_processors_as_gpus_and_counts_unknown_runtimes() {
        let t = parse(SWF, TraceFormat::Swf, false).expect("parses");
        assert_eq!((t.unusable_rows, t.non_gpu_rows), (1, 0));
        let got: Vec<_> = t
            .jobs
            .iter()
            .map(|j| {
                (
                    j.line,
                    j.submit_s,
                    j.gpus,
                    j.nodes,
                    j.runtime_s,
                    j.requested_s,
                    j.status.as_str(),
                    j.user.as_str(),
                    j.name.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (6, 0, 16, 1, 3612, Some(7200), "Completed", "3", Some("1")),
                (10, 20, 2, 1, 100, None, "Cancelled", "", Some("7")),
                // Allocated processors unknown: the requested ones.
                (7, 45, 4, 1, 86, Some(600), "Failed", "5", None),
            ]
        );
    }

    #[test]
    fn swf_bad_lines_name_their_line_and_field() {
        let ok = "1 0 12 3612 16 3598 -1 16 7200 -1 1 3 1 1 1 1 -1 -1";
        for (row, column) in [
            (
                "2 5 0 ten 4 80 -1 4 600 -1 1 5 2 2 1 1 -1 -1",
                "field 4 (run time)",
            ),
            (
                "2 5 0 -2 4 80 -1 4 600 -1 1 5 2 2 1 1 -1 -1",
                "field 4 (run time)",
            ),
            (
                "2 x 0 10 4 80 -1 4 600 -1 1 5 2 2 1 1 -1 -1",
                "field 2 (submit time)",
            ),
            (
                "2 5 0 10 70000 80 -1 4 600 -1 1 5 2 2 1 1 -1 -1",
                "field 5 (allocated processors)",
            ),
            (
                "2 5 0 10 4 80 -1 4 600.5 -1 1 5 2 2 1 1 -1 -1",
                "field 9 (requested time)",
            ),
            (
                "2 400000000 0 10 4 80 -1 4 600 -1 1 5 2 2 1 1 -1 -1",
                "field 2 (submit time)",
            ),
            ("2 5 0 10 4 80 -1 4 600 -1 1 5 2 2 1 1 -1", "row"),
        ] {
            let text = format!("; Version: 2.2\n{ok}\n{row}\n");
            let err = parse(&text, TraceFormat::Swf, false).expect_err(row);
            assert_eq!((err.line, err.column.as_str()), (3, column), "{err}");
            assert!(err.to_string().starts_with("line 3, column `"), "{err}");
            let t = parse(&text, TraceFormat::Swf, true).expect("skips");
            assert_eq!((t.jobs.len(), t.skipped), (1, 1), "{row}");
        }
    }

    /// The synthetic samples in tests/data/traces (for `scripts/sim-all.sh`) stay readable.
    #[test]
    fn the_sample_files_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/traces/");
        let helios = file_text(&format!("{dir}helios_sample.csv"));
        let t = parse(&helios, TraceFormat::Helios, false).expect("helios sample");
        assert_eq!((t.jobs.len(), t.non_gpu_rows), (10, 2));
        assert!(t.jobs.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
        let swf = file_text(&format!("{dir}swf_sample.swf"));
        let t = parse(&swf, TraceFormat::Swf, false).expect("swf sample");
        assert_eq!((t.jobs.len(), t.unusable_rows), (9, 1));
    }
}
