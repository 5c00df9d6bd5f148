//! TensorBoard event files (`events.out.tfevents.*`): the writer behind `log_scalar` and the
//! reader behind `msl plot`.
//!
//! An event file is a sequence of records, each the length of its data (u64, little-endian), a
//! masked CRC-32C of those 8 bytes, the data, and a masked CRC-32C of the data (TensorFlow's
//! `TFRecord` framing). Each record's data is a protobuf `Event` (TensorFlow's `event.proto`):
//! `wall_time` (1, double), `step` (2, int64), `file_version` (3, string) and `summary` (5),
//! whose `value`s (1) carry a `tag` (1) and a `simple_value` (2, float). The first event of a
//! file holds only the wall time and `file_version: "brain.Event:2"`, as TensorFlow writes it.
//!
//! The format is small enough to write here (the protobuf encoder is a few functions): the
//! `tensorboard-rs` crate panics on an unwritable folder and pulls in protobuf 2 and an old
//! `image`. The reader also accepts the scalars TensorFlow 2 writes (a `tensor` (8) value whose
//! metadata (9) names the `scalars` plugin), so `msl plot` draws logs of other tools too.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// One logged scalar, as read back from a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    pub value: f64,
    pub wall_time: f64,
}

/// An open event file that scalars are appended to. Every record goes to the file in one write,
/// unbuffered, so TensorBoard (or `msl plot`) sees each value as soon as it is logged.
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

/// Distinguishes the files one process creates in one second (a REPL session, `msl test`).
static FILE_COUNTER: AtomicU32 = AtomicU32::new(0);

impl EventWriter {
    /// Creates `dir` (and its parents) and a new event file in it, named as TensorFlow names
    /// them (`events.out.tfevents.<seconds>.<host>.<pid>.<n>`); an existing file is never
    /// overwritten.
    pub fn create(dir: &Path) -> io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let now = wall_time();
        let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("events.out.tfevents.{:010}.{}.{}.{n}", now as u64, hostname(), std::process::id());
        let path = dir.join(name);
        let file = File::options().write(true).create_new(true).open(&path)?;
        let mut w = EventWriter { file, path };
        let mut event = Vec::new();
        put_double(&mut event, 1, now);
        put_bytes(&mut event, 3, b"brain.Event:2");
        w.record(&event)?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one scalar event.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f32, wall_time: f64) -> io::Result<()> {
        let mut v = Vec::new();
        put_bytes(&mut v, 1, tag.as_bytes());
        put_key(&mut v, 2, WIRE_FIXED32);
        v.extend_from_slice(&value.to_le_bytes());
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, &v);
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time);
        put_key(&mut event, 2, WIRE_VARINT);
        put_varint(&mut event, step as u64);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    fn record(&mut self, data: &[u8]) -> io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut rec = Vec::with_capacity(data.len() + 16);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
        rec.extend_from_slice(data);
        rec.extend_from_slice(&masked_crc32c(data).to_le_bytes());
        self.file.write_all(&rec)
    }
}

/// Seconds since the Unix epoch, the `wall_time` of an event.
pub fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The host name for file names (letters, digits, `-` and `_` only; `localhost` if unknown).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `gethostname` writes at most `buf.len()` bytes into the valid buffer.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name: String = String::from_utf8_lossy(&buf[..end])
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if ok && !name.is_empty() {
        name
    } else {
        "localhost".into()
    }
}

/// What one event file holds: its scalars, and why reading stopped early if it did.
#[derive(Debug, Default)]
pub struct Events {
    pub scalars: Vec<Scalar>,
    /// A corrupt record (bad checksum, or data that is not an event): the scalars before it are
    /// kept. A record cut off at the end of the file is not a problem: it is being written.
    pub problem: Option<String>,
}

/// Reads every scalar of an event file.
pub fn read_events(path: &Path) -> io::Result<Events> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    Ok(parse_events(&bytes))
}

/// The scalars of the records in `bytes` (the contents of an event file).
pub fn parse_events(bytes: &[u8]) -> Events {
    let mut out = Events::default();
    let mut at = 0usize;
    while bytes.len() - at >= 12 {
        let len_bytes = &bytes[at..at + 8];
        let stored = u32::from_le_bytes([bytes[at + 8], bytes[at + 9], bytes[at + 10], bytes[at + 11]]);
        if masked_crc32c(len_bytes) != stored {
            out.problem = Some(format!("the record at byte {at} has a bad length checksum"));
            return out;
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(len_bytes);
        let len = u64::from_le_bytes(len8);
        let rest = (bytes.len() - at - 12) as u64;
        if rest < len.saturating_add(4) {
            return out; // cut off: the writer has not finished this record
        }
        let data = &bytes[at + 12..at + 12 + len as usize];
        let end = at + 12 + len as usize;
        let crc = u32::from_le_bytes([bytes[end], bytes[end + 1], bytes[end + 2], bytes[end + 3]]);
        if masked_crc32c(data) != crc {
            out.problem = Some(format!("the record at byte {at} has a bad data checksum"));
            return out;
        }
        if let Err(why) = event_scalars(data, &mut out.scalars) {
            out.problem = Some(format!("the record at byte {at} is not an event ({why})"));
            return out;
        }
        at = end + 4;
    }
    out
}

/// Appends the scalars of one `Event` message.
fn event_scalars(data: &[u8], out: &mut Vec<Scalar>) -> Result<(), &'static str> {
    let (mut wall_time, mut step, mut summaries) = (0.0, 0i64, Vec::new());
    for f in Fields(data) {
        match f? {
            (1, Wire::Fixed64(b)) => wall_time = f64::from_bits(b),
            (2, Wire::Varint(v)) => step = v as i64,
            (5, Wire::Bytes(b)) => summaries.push(b),
            _ => {}
        }
    }
    for s in summaries {
        for f in Fields(s) {
            if let (1, Wire::Bytes(v)) = f? {
                if let Some((tag, value)) = summary_value(v)? {
                    out.push(Scalar { tag, step, value, wall_time });
                }
            }
        }
    }
    Ok(())
}

/// The tag and number of one `Summary.Value`, if it is a scalar.
fn summary_value(data: &[u8]) -> Result<Option<(String, f64)>, &'static str> {
    let (mut tag, mut simple, mut tensor, mut plugin) = (String::new(), None, None, None);
    for f in Fields(data) {
        match f? {
            (1, Wire::Bytes(b)) => tag = String::from_utf8_lossy(b).into_owned(),
            (2, Wire::Fixed32(b)) => simple = Some(f32::from_bits(b) as f64),
            (8, Wire::Bytes(b)) => tensor = Some(b),
            (9, Wire::Bytes(b)) => plugin = plugin_name(b)?,
            _ => {}
        }
    }
    if let Some(v) = simple {
        return Ok(Some((tag, v)));
    }
    match (tensor, plugin.as_deref()) {
        (Some(t), Some("scalars")) => Ok(tensor_scalar(t)?.map(|v| (tag, v))),
        _ => Ok(None),
    }
}

/// `SummaryMetadata.plugin_data.plugin_name`.
fn plugin_name(data: &[u8]) -> Result<Option<String>, &'static str> {
    let mut name = None;
    for f in Fields(data) {
        if let (1, Wire::Bytes(pd)) = f? {
            for g in Fields(pd) {
                if let (1, Wire::Bytes(n)) = g? {
                    name = Some(String::from_utf8_lossy(n).into_owned());
                }
            }
        }
    }
    Ok(name)
}

/// The one number of a float or double `TensorProto` (`float_val`, `double_val` or
/// `tensor_content`), as TensorFlow 2's `tf.summary.scalar` writes it.
fn tensor_scalar(data: &[u8]) -> Result<Option<f64>, &'static str> {
    const DT_FLOAT: u64 = 1;
    const DT_DOUBLE: u64 = 2;
    let (mut dtype, mut values) = (0, Vec::new());
    let mut content: &[u8] = &[];
    for f in Fields(data) {
        match f? {
            (1, Wire::Varint(d)) => dtype = d,
            (4, Wire::Bytes(b)) => content = b,
            (5, Wire::Fixed32(b)) => values.push(f32::from_bits(b) as f64),
            (5, Wire::Bytes(b)) => {
                values.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
            }
            (6, Wire::Fixed64(b)) => values.push(f64::from_bits(b)),
            (6, Wire::Bytes(b)) => values.extend(b.chunks_exact(8).map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                f64::from_le_bytes(a)
            })),
            _ => {}
        }
    }
    match (dtype, content.len()) {
        (DT_FLOAT, 4) => values.push(f32::from_le_bytes([content[0], content[1], content[2], content[3]]) as f64),
        (DT_DOUBLE, 8) => {
            let mut a = [0u8; 8];
            a.copy_from_slice(content);
            values.push(f64::from_le_bytes(a));
        }
        _ => {}
    }
    Ok(if matches!(dtype, DT_FLOAT | DT_DOUBLE) && values.len() == 1 { Some(values[0]) } else { None })
}

// ---- Protobuf wire format: just what events need.

const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_BYTES: u32 = 2;
const WIRE_FIXED32: u32 = 5;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from(field << 3 | wire));
}

fn put_double(out: &mut Vec<u8>, field: u32, v: f64) {
    put_key(out, field, WIRE_FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    put_key(out, field, WIRE_BYTES);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// One field's payload.
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// The fields of a message, in order; an error ends the iteration.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.0.split_first().ok_or("a varint runs past the end")?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("a varint longer than 10 bytes")
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], &'static str> {
        if n > self.0.len() as u64 {
            return Err("a field runs past the end");
        }
        let (a, b) = self.0.split_at(n as usize);
        self.0 = b;
        Ok(a)
    }

    fn field(&mut self) -> Result<(u32, Wire<'a>), &'static str> {
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| "a field number out of range")?;
        let wire = match (key & 7) as u32 {
            WIRE_VARINT => Wire::Varint(self.varint()?),
            WIRE_FIXED64 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(self.take(8)?);
                Wire::Fixed64(u64::from_le_bytes(a))
            }
            WIRE_BYTES => {
                let n = self.varint()?;
                Wire::Bytes(self.take(n)?)
            }
            WIRE_FIXED32 => {
                let b = self.take(4)?;
                Wire::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            _ => return Err("an unsupported wire type"),
        };
        Ok((field, wire))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>), &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let r = self.field();
        if r.is_err() {
            self.0 = &[];
        }
        Some(r)
    }
}

// ---- CRC-32C (Castagnoli), masked as TFRecord masks it.

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0x82f6_3b78 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

fn crc32c(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |c, &b| CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("msl-tfevents-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_reader_reads_back_what_the_writer_wrote() {
        let dir = temp_dir("roundtrip");
        let mut w = EventWriter::create(&dir.join("a/b")).unwrap();
        let logged = [("loss", 0, 2.5f32), ("loss", 1, 1.25), ("acc/test", 1, 0.75), ("loss", -3, f32::NAN)];
        for (i, (tag, step, v)) in logged.iter().enumerate() {
            w.scalar(tag, *step, *v, 1000.0 + i as f64).unwrap();
        }
        let name = w.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        let ev = read_events(w.path()).unwrap();
        assert_eq!(ev.problem, None);
        assert_eq!(ev.scalars.len(), logged.len());
        for (i, (s, (tag, step, v))) in ev.scalars.iter().zip(&logged).enumerate() {
            assert_eq!((s.tag.as_str(), s.step), (*tag, *step));
            assert_eq!(s.value.to_bits(), (*v as f64).to_bits());
            assert_eq!(s.wall_time, 1000.0 + i as f64);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cut_off_record_ends_the_file_and_a_corrupt_one_is_reported() {
        let dir = temp_dir("corrupt");
        let mut w = EventWriter::create(&dir).unwrap();
        w.scalar("x", 1, 1.0, 0.0).unwrap();
        w.scalar("x", 2, 2.0, 0.0).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let cut = parse_events(&bytes[..bytes.len() - 3]);
        assert_eq!((cut.scalars.len(), cut.problem), (1, None));
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 6] ^= 0x40;
        let ev = parse_events(&bad);
        assert_eq!(ev.scalars.len(), 1);
        assert!(ev.problem.unwrap().contains("bad data checksum"));
        // Any bytes at all give an answer, never a panic.
        for i in 0..bytes.len() {
            let _ = parse_events(&bytes[i..]);
            let mut b = bytes.clone();
            b[i] = b[i].wrapping_add(0x55);
            let _ = parse_events(&b);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tensorflow_2_tensor_scalars_are_read() {
        // Summary.Value { tag: "t", tensor: { dtype: DT_FLOAT, float_val: [0.5] },
        // metadata: { plugin_data: { plugin_name: "scalars" } } }
        let mut tensor = Vec::new();
        put_key(&mut tensor, 1, WIRE_VARINT);
        put_varint(&mut tensor, 1);
        put_bytes(&mut tensor, 5, &0.5f32.to_le_bytes());
        let mut pd = Vec::new();
        put_bytes(&mut pd, 1, b"scalars");
        let mut meta = Vec::new();
        put_bytes(&mut meta, 1, &pd);
        let mut v = Vec::new();
        put_bytes(&mut v, 1, b"t");
        put_bytes(&mut v, 8, &tensor);
        put_bytes(&mut v, 9, &meta);
        assert_eq!(summary_value(&v), Ok(Some(("t".to_string(), 0.5))));
    }
}
