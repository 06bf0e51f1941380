//! The flight recorder: every step of a [`crate::Tracker`] (sensors in,
//! targets out, events, step time) into a bounded in-memory ring that a
//! thread of its own writes to a file, so the control step never blocks on
//! I/O and allocates nothing. Replayed by [`read_log`] and `pmstate deploy
//! replay --from-log`, bit for bit.
//!
//! The ring is `rtrb`'s wait-free single-producer single-consumer buffer:
//! the step copies one fixed-size record into it (or, when it is full,
//! drops the record and counts it); the writer drains whole records.
//!
//! # Format (version 1, little-endian; docs/deploy.md, "Flight recorder")
//!
//! `PMFLIGHT`, then `u32` version, `u32` header length, the header (JSON:
//! sizes, the tracker's options with every float as its bit pattern, the
//! files it ran on, a fingerprint of the resampled clip), then records of
//! `record_bytes` each: `u32` kind (0 step, 1 refused reading, 2 reset,
//! 3 operator stop), `u32` events, `u64` sequence number, `u64` step
//! nanoseconds, `u32` flags (1 sensors, 2 anchor_pos, 4 bodies, 8 stamp),
//! `u32` 0, `f64` stamp taken, `f64` stamp now, then float32: dof_pos [D],
//! dof_vel [D], anchor_rot [4], root_local_ang_vel [3], anchor_pos [3],
//! body_pos [B, 3], body_rot [B, 4], body_vel [B, 3], body_ang_vel [B, 3],
//! ground_height, actions [D], joint_pos_targets [D], stiffness [D],
//! damping [D].

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::envelope::{EndOfClip, Envelope, JointLimits, SafePose, SensorBounds};
use crate::error::{DeployError, Result};
use crate::tracker::{BodyState, PdTargets, Sensors, Stamp, TrackerOptions};

/// The log format's version.
pub const LOG_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"PMFLIGHT";
/// Records the ring holds: 20 s at 50 Hz before the writer must have run.
const RING_RECORDS: usize = 1024;
/// The most header bytes a reader accepts.
const MAX_HEADER: u32 = 1 << 20;
/// The most bytes one record may take (bounds a reader's buffer).
const MAX_RECORD: usize = 16 << 20;
/// How long the writer sleeps when the ring is empty.
const POLL: Duration = Duration::from_millis(2);

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A step that returned targets.
    Step = 0,
    /// A reading refused.
    Refused = 1,
    /// [`crate::Tracker::reset`].
    Reset = 2,
    /// [`crate::Tracker::stop`].
    Stop = 3,
}

impl RecordKind {
    /// Its name in words.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Step => "a step",
            RecordKind::Refused => "a refused reading",
            RecordKind::Reset => "a reset",
            RecordKind::Stop => "an operator stop",
        }
    }
}

/// The files a log was made on (for people; replay takes its files from its caller).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogMeta {
    /// The checkpoint.
    pub checkpoint: String,
    /// The configs file, when not the one next to the checkpoint.
    pub config: Option<String>,
    /// The motion clip.
    pub motion: String,
}

/// The fixed layout of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    num_dofs: usize,
    num_bodies: usize,
}

impl Layout {
    pub(crate) fn new(num_dofs: usize, num_bodies: usize) -> Self {
        Layout { num_dofs, num_bodies }
    }

    fn floats(&self) -> Option<usize> {
        let (d, b) = (self.num_dofs, self.num_bodies);
        d.checked_mul(6)?.checked_add(b.checked_mul(13)?)?.checked_add(4 + 3 + 3 + 1)
    }

    /// Bytes of one record (bounded by [`MAX_RECORD`]).
    fn bytes(&self) -> Option<usize> {
        let n = self.floats()?.checked_mul(4)?.checked_add(48)?;
        (n <= MAX_RECORD).then_some(n)
    }
}

/// A float32 vector as bit patterns, so the header round-trips exactly.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn floats(v: &[u32]) -> Vec<f32> {
    v.iter().map(|&b| f32::from_bits(b)).collect()
}

/// [`TrackerOptions`] with every float as its bits.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LoggedOptions {
    action_ema_alpha: u64,
    pd_target_max_accel: Option<u64>,
    joint_limits: Option<(Vec<u32>, Vec<u32>)>,
    max_target_rate: Option<Vec<u32>>,
    soft_start_seconds: u64,
    max_tilt: Option<u32>,
    stale_after_periods: Option<u32>,
    end_of_clip_stop: bool,
    safe_pose: Option<Vec<u32>>,
    sensor_bounds: [u32; 5],
}

impl LoggedOptions {
    fn of(o: &TrackerOptions) -> Self {
        let e = &o.envelope;
        let b = &e.sensor_bounds;
        LoggedOptions {
            action_ema_alpha: o.action_ema_alpha.to_bits(),
            pd_target_max_accel: o.pd_target_max_accel.map(f64::to_bits),
            joint_limits: e.joint_limits.as_ref().map(|l| (bits(&l.lower), bits(&l.upper))),
            max_target_rate: e.max_target_rate.as_deref().map(bits),
            soft_start_seconds: e.soft_start_seconds.to_bits(),
            max_tilt: e.max_tilt.map(f32::to_bits),
            stale_after_periods: e.stale_after_periods,
            end_of_clip_stop: e.end_of_clip == EndOfClip::Stop,
            safe_pose: match &e.safe_pose {
                SafePose::Measured => None,
                SafePose::Pose(p) => Some(bits(p)),
            },
            sensor_bounds: [b.joint_position, b.joint_velocity, b.angular_velocity, b.position, b.linear_velocity]
                .map(f32::to_bits),
        }
    }

    fn options(&self) -> TrackerOptions {
        let s = self.sensor_bounds.map(f32::from_bits);
        TrackerOptions {
            action_ema_alpha: f64::from_bits(self.action_ema_alpha),
            pd_target_max_accel: self.pd_target_max_accel.map(f64::from_bits),
            envelope: Envelope {
                joint_limits: self
                    .joint_limits
                    .as_ref()
                    .map(|(l, u)| JointLimits { lower: floats(l), upper: floats(u) }),
                max_target_rate: self.max_target_rate.as_deref().map(floats),
                soft_start_seconds: f64::from_bits(self.soft_start_seconds),
                max_tilt: self.max_tilt.map(f32::from_bits),
                stale_after_periods: self.stale_after_periods,
                end_of_clip: if self.end_of_clip_stop { EndOfClip::Stop } else { EndOfClip::Hold },
                safe_pose: self.safe_pose.as_deref().map_or(SafePose::Measured, |p| SafePose::Pose(floats(p))),
                sensor_bounds: SensorBounds {
                    joint_position: s[0],
                    joint_velocity: s[1],
                    angular_velocity: s[2],
                    position: s[3],
                    linear_velocity: s[4],
                },
            },
        }
    }
}

/// The header of a log.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    version: u32,
    num_dofs: usize,
    num_bodies: usize,
    record_bytes: usize,
    options: LoggedOptions,
    meta: LogMeta,
}

/// One record of a step as the tracker passes it.
pub(crate) struct Record<'a, 'b> {
    pub(crate) kind: RecordKind,
    pub(crate) events: u32,
    pub(crate) step_ns: u64,
    pub(crate) sensors: Option<&'a Sensors<'b>>,
    pub(crate) out: &'a PdTargets,
}

/// What a finished recording wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecorderSummary {
    /// Records written.
    pub records: u64,
    /// Records dropped because the ring was full.
    pub dropped: u64,
}

/// The recording side, owned by the tracker.
pub(crate) struct Recorder {
    ring: rtrb::Producer<u8>,
    record: Vec<u8>,
    layout: Layout,
    seq: u64,
    dropped: u64,
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    file: String,
    writer: Option<JoinHandle<std::io::Result<u64>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("file", &self.file).field("seq", &self.seq).finish()
    }
}

impl Recorder {
    /// Opens `path` (a FIFO or device is written as a stream: it is opened,
    /// never replaced), writes the header and starts the writer thread.
    pub(crate) fn start(path: &Path, layout: Layout, options: &TrackerOptions, meta: &LogMeta) -> Result<Self> {
        let file = path.display().to_string();
        let bad = |problem: String| DeployError::Log { file: file.clone(), problem };
        let record_bytes = layout.bytes().ok_or_else(|| bad("a record would exceed 16 MiB".into()))?;
        let header = Header {
            version: LOG_VERSION,
            num_dofs: layout.num_dofs,
            num_bodies: layout.num_bodies,
            record_bytes,
            options: LoggedOptions::of(options),
            meta: meta.clone(),
        };
        let json = serde_json::to_vec(&header).map_err(|e| bad(e.to_string()))?;
        let len = u32::try_from(json.len()).map_err(|_| bad("header too long".into()))?;
        // a regular file truncated; a FIFO or character device opened as it
        // is (never unlinked or replaced; a FIFO without a reader an error at
        // once, not a caller held in `open`); a directory, block device or
        // socket refused
        let out = pmstate_ckpt::open_stream_output(path).map_err(|e| {
            bad(match e {
                pmstate_ckpt::CkptError::NotAFile { kind, .. } => {
                    format!("is {kind}: a flight log goes to a regular file, a FIFO or a character device")
                }
                pmstate_ckpt::CkptError::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            })
        })?;
        let mut w = BufWriter::new(out);
        let io = |e: std::io::Error| bad(e.to_string());
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&LOG_VERSION.to_le_bytes()).map_err(io)?;
        w.write_all(&len.to_le_bytes()).map_err(io)?;
        w.write_all(&json).map_err(io)?;
        w.flush().map_err(io)?;
        let capacity = record_bytes.checked_mul(RING_RECORDS).ok_or_else(|| bad("ring too large".into()))?;
        // rtrb 0.4 has no fallible constructor (`RingBuffer::new` allocates
        // with `Vec::with_capacity`, which aborts on failure), so the same
        // allocation is first made fallibly and freed: a size the allocator
        // refuses (or one past isize::MAX) is an error here, not an abort.
        // The probe is the bound: `record_bytes` is at most 16 MiB (`Layout::bytes`),
        // so the ring at most 16 GiB; only memory taken by another thread
        // between the probe and the allocation could still abort.
        let mut ring_mem = Vec::<u8>::new();
        ring_mem
            .try_reserve_exact(capacity)
            .map_err(|_| DeployError::Allocation { what: "the flight recorder's ring", bytes: capacity })?;
        drop(ring_mem);
        let (producer, mut consumer) = rtrb::RingBuffer::<u8>::new(capacity);
        let mut record = Vec::new();
        record
            .try_reserve_exact(record_bytes)
            .map_err(|_| DeployError::Allocation { what: "a flight-recorder record", bytes: record_bytes })?;
        record.resize(record_bytes, 0u8);
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let (stop2, failed2) = (stop.clone(), failed.clone());
        // The new thread's start-up (std's thread-local bookkeeping, the test
        // harness's output capture) may allocate; `start` returns only once
        // it is done, so no allocation of the recorder's lands inside the
        // control loop, however late the scheduler runs the thread.
        let started = Arc::new(Barrier::new(2));
        let started2 = started.clone();
        let writer = std::thread::Builder::new()
            .name("pmstate-flight-recorder".into())
            .spawn(move || -> std::io::Result<u64> {
                // a reader of a FIFO log that goes away is an error, not the host's death
                crate::realtime::block_sigpipe();
                started2.wait();
                drop(started2);
                let mut written = 0u64;
                let mut error = None;
                loop {
                    let n = consumer.slots();
                    if n > 0 {
                        if let Ok(chunk) = consumer.read_chunk(n) {
                            let (a, b) = chunk.as_slices();
                            if error.is_none() {
                                if let Err(e) = w.write_all(a).and_then(|_| w.write_all(b)) {
                                    failed2.store(true, Ordering::Relaxed);
                                    error = Some(e);
                                }
                            }
                            chunk.commit_all();
                            written += (n / record_bytes) as u64;
                        }
                    } else if stop2.load(Ordering::Acquire) {
                        break;
                    } else {
                        std::thread::sleep(POLL);
                    }
                }
                if let Some(e) = error {
                    return Err(e);
                }
                w.flush()?;
                Ok(written)
            })
            .map_err(|e| bad(format!("could not start the writer thread: {e}")))?;
        started.wait();
        Ok(Recorder { ring: producer, record, layout, seq: 0, dropped: 0, stop, failed, file, writer: Some(writer) })
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Copies one record into the ring; never blocks, never allocates.
    pub(crate) fn push(&mut self, r: &Record<'_, '_>) {
        let seq = self.seq;
        self.seq += 1;
        encode(&mut self.record, self.layout, seq, r);
        let n = self.record.len();
        match self.ring.write_chunk(n) {
            Ok(mut chunk) => {
                let (a, b) = chunk.as_mut_slices();
                let split = a.len();
                a.copy_from_slice(&self.record[..split]);
                b.copy_from_slice(&self.record[split..]);
                chunk.commit_all();
            }
            Err(_) => self.dropped += 1,
        }
    }

    /// Writes what the ring holds, closes the file, joins the writer.
    pub(crate) fn finish(mut self) -> Result<RecorderSummary> {
        self.join()
    }

    fn join(&mut self) -> Result<RecorderSummary> {
        self.stop.store(true, Ordering::Release);
        let file = self.file.clone();
        let bad = |problem: String| DeployError::Log { file: file.clone(), problem };
        match self.writer.take().map(JoinHandle::join) {
            None => Ok(RecorderSummary { records: 0, dropped: self.dropped }),
            Some(Ok(Ok(records))) => Ok(RecorderSummary { records, dropped: self.dropped }),
            Some(Ok(Err(e))) => Err(bad(e.to_string())),
            Some(Err(_)) => Err(bad("the writer thread panicked".into())),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // flushes what the ring holds; an error was already counted in `failed`
        let _ = self.join();
    }
}

/// Writes `r` into `buf` (exactly `layout.bytes()` long).
fn encode(buf: &mut [u8], layout: Layout, seq: u64, r: &Record<'_, '_>) {
    let (nd, nb) = (layout.num_dofs, layout.num_bodies);
    let mut at = 0usize;
    let mut put = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    let s = r.sensors;
    let mut flags = 0u32;
    if let Some(s) = s {
        flags |= 1;
        flags |= if s.anchor_pos.is_some() { 2 } else { 0 };
        flags |= if s.bodies.is_some() { 4 } else { 0 };
        flags |= if s.stamp.is_some() { 8 } else { 0 };
    }
    put(&(r.kind as u32).to_le_bytes());
    put(&r.events.to_le_bytes());
    put(&seq.to_le_bytes());
    put(&r.step_ns.to_le_bytes());
    put(&flags.to_le_bytes());
    put(&0u32.to_le_bytes());
    let stamp = s.and_then(|s| s.stamp).unwrap_or(Stamp { taken: 0.0, now: 0.0 });
    put(&stamp.taken.to_le_bytes());
    put(&stamp.now.to_le_bytes());
    let mut floats = |v: &[f32], len: usize| {
        for i in 0..len {
            put(&v.get(i).copied().unwrap_or(0.0).to_le_bytes());
        }
    };
    let empty: &[f32] = &[];
    floats(s.map_or(empty, |s| s.dof_pos), nd);
    floats(s.map_or(empty, |s| s.dof_vel), nd);
    floats(s.map_or(&[0.0; 4], |s| &s.anchor_rot), 4);
    floats(s.map_or(&[0.0; 3], |s| &s.root_local_ang_vel), 3);
    let ap = s.and_then(|s| s.anchor_pos).unwrap_or([0.0; 3]);
    floats(&ap, 3);
    let b = s.and_then(|s| s.bodies);
    floats(b.map_or(empty, |b| b.pos), nb * 3);
    floats(b.map_or(empty, |b| b.rot), nb * 4);
    floats(b.map_or(empty, |b| b.vel), nb * 3);
    floats(b.map_or(empty, |b| b.ang_vel), nb * 3);
    floats(&[b.map_or(0.0, |b| b.ground_height)], 1);
    floats(&r.out.actions, nd);
    floats(&r.out.joint_pos_targets, nd);
    floats(&r.out.stiffness, nd);
    floats(&r.out.damping, nd);
}

/// A logged body state: pos, rot, vel, ang_vel and the ground height.
pub type LoggedBodies = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, f32);

/// The sensors of a logged step, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedSensors {
    /// `[D]`.
    pub dof_pos: Vec<f32>,
    /// `[D]`.
    pub dof_vel: Vec<f32>,
    /// xyzw.
    pub anchor_rot: [f32; 4],
    /// The gyroscope.
    pub root_local_ang_vel: [f32; 3],
    /// When given.
    pub anchor_pos: Option<[f32; 3]>,
    /// pos, rot, vel, ang_vel (`[B, 3]`, `[B, 4]`, `[B, 3]`, `[B, 3]`) and the ground height, when given.
    pub bodies: Option<LoggedBodies>,
    /// When given.
    pub stamp: Option<Stamp>,
}

impl LoggedSensors {
    /// As the tracker takes them.
    pub fn sensors(&self) -> Sensors<'_> {
        Sensors {
            dof_pos: &self.dof_pos,
            dof_vel: &self.dof_vel,
            anchor_rot: self.anchor_rot,
            root_local_ang_vel: self.root_local_ang_vel,
            anchor_pos: self.anchor_pos,
            bodies: self.bodies.as_ref().map(|(pos, rot, vel, ang_vel, g)| BodyState {
                pos,
                rot,
                vel,
                ang_vel,
                ground_height: *g,
            }),
            stamp: self.stamp,
        }
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    /// Its kind: `step`, `refused`, `reset`, `stop`.
    pub kind: RecordKind,
    /// The step's events (bits of [`crate::envelope::events`]).
    pub events: u32,
    /// Its sequence number (a gap: records dropped).
    pub seq: u64,
    /// How long the step took.
    pub step_ns: u64,
    /// The readings (steps and refusals).
    pub sensors: Option<LoggedSensors>,
    /// What the tracker output after it.
    pub out: PdTargets,
}

/// A log being read, record by record (memory: one record).
pub struct LogReader {
    file: String,
    input: BufReader<File>,
    header: Header,
    buf: Vec<u8>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader").field("file", &self.file).finish()
    }
}

/// Opens a flight-recorder log: checks its magic, version and header.
pub fn read_log(path: &Path) -> Result<LogReader> {
    let file = path.display().to_string();
    let bad = |problem: String| DeployError::Log { file: file.clone(), problem };
    let mut input = BufReader::new(File::open(path).map_err(|e| bad(e.to_string()))?);
    let mut head = [0u8; 16];
    input.read_exact(&mut head).map_err(|_| bad("shorter than a log's 16-byte start".into()))?;
    if &head[..8] != MAGIC {
        return Err(bad("not a pmstate flight-recorder log (no PMFLIGHT magic)".into()));
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if version != LOG_VERSION {
        return Err(bad(format!("format version {version}; this build reads version {LOG_VERSION}")));
    }
    let len = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
    if len > MAX_HEADER {
        return Err(bad(format!("a header of {len} bytes (at most {MAX_HEADER})")));
    }
    let mut json = vec![0u8; len as usize];
    input.read_exact(&mut json).map_err(|_| bad("the header is cut short".into()))?;
    let header: Header = serde_json::from_slice(&json).map_err(|e| bad(format!("header: {e}")))?;
    let layout = Layout::new(header.num_dofs, header.num_bodies);
    if layout.bytes() != Some(header.record_bytes) {
        return Err(bad(format!(
            "records of {} bytes do not fit {} joints and {} bodies",
            header.record_bytes, header.num_dofs, header.num_bodies
        )));
    }
    let buf = vec![0u8; header.record_bytes];
    Ok(LogReader { file, input, header, buf })
}

impl LogReader {
    /// The tracker's options when it logged (floats bit for bit).
    pub fn options(&self) -> TrackerOptions {
        self.header.options.options()
    }

    /// The files it was made on.
    pub fn meta(&self) -> &LogMeta {
        &self.header.meta
    }

    /// Joints and bodies.
    pub fn dims(&self) -> (usize, usize) {
        (self.header.num_dofs, self.header.num_bodies)
    }

    /// The next record, `None` at the end; a record cut short is an error.
    pub fn next_record(&mut self) -> Result<Option<LogRecord>> {
        let mut got = 0;
        while got < self.buf.len() {
            match self.input.read(&mut self.buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DeployError::Log { file: self.file.clone(), problem: e.to_string() }),
            }
        }
        if got == 0 {
            return Ok(None);
        }
        if got < self.buf.len() {
            return Err(DeployError::Log {
                file: self.file.clone(),
                problem: format!("the last record is cut short ({got} of {} bytes)", self.buf.len()),
            });
        }
        decode(&self.buf, Layout::new(self.header.num_dofs, self.header.num_bodies))
            .map(Some)
            .ok_or_else(|| DeployError::Log { file: self.file.clone(), problem: "a record of unknown kind".into() })
    }
}

fn decode(buf: &[u8], layout: Layout) -> Option<LogRecord> {
    let (nd, nb) = (layout.num_dofs, layout.num_bodies);
    let mut at = 0usize;
    let mut take = |n: usize| -> &[u8] {
        let s = &buf[at..at + n];
        at += n;
        s
    };
    let u32_ = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let u64_ = |b: &[u8]| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let kind = match u32_(take(4)) {
        0 => RecordKind::Step,
        1 => RecordKind::Refused,
        2 => RecordKind::Reset,
        3 => RecordKind::Stop,
        _ => return None,
    };
    let events = u32_(take(4));
    let seq = u64_(take(8));
    let step_ns = u64_(take(8));
    let flags = u32_(take(4));
    take(4);
    let taken = f64::from_bits(u64_(take(8)));
    let now = f64::from_bits(u64_(take(8)));
    let mut vec =
        |n: usize| -> Vec<f32> { (0..n).map(|_| f32::from_le_bytes(take(4).try_into().unwrap_or([0; 4]))).collect() };
    let dof_pos = vec(nd);
    let dof_vel = vec(nd);
    let r = vec(4);
    let g = vec(3);
    let ap = vec(3);
    let (bp, br, bv, bw) = (vec(nb * 3), vec(nb * 4), vec(nb * 3), vec(nb * 3));
    let ground = vec(1)[0];
    let out = PdTargets { actions: vec(nd), joint_pos_targets: vec(nd), stiffness: vec(nd), damping: vec(nd) };
    let sensors = (flags & 1 != 0).then(|| LoggedSensors {
        dof_pos,
        dof_vel,
        anchor_rot: [r[0], r[1], r[2], r[3]],
        root_local_ang_vel: [g[0], g[1], g[2]],
        anchor_pos: (flags & 2 != 0).then_some([ap[0], ap[1], ap[2]]),
        bodies: (flags & 4 != 0).then_some((bp, br, bv, bw, ground)),
        stamp: (flags & 8 != 0).then_some(Stamp { taken, now }),
    });
    Some(LogRecord { kind, events, seq, step_ns, sensors, out })
}
