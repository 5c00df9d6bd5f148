//! `msl plot LOGDIR… -o FILE`: every scalar of TensorBoard event files drawn against its step
//! with plotters, as a PNG or an SVG picture: one chart per tag, with a line per run, except
//! that tags sharing a prefix before their last `/` share a chart (`accuracy/train` and
//! `accuracy/test` are two lines of the chart `accuracy`, as train and test curves are read).
//!
//! Each folder under a LOGDIR that holds event files is one run (as TensorBoard finds runs);
//! its files are read in name order (their names start with the time they were made), and a
//! step that goes back drops the later points of that tag, as TensorBoard does when a run was
//! restarted into the same folder. Text is drawn with the Go font shipped in `assets/fonts/`
//! (BSD licence), so no system font is needed.

use crate::tfevents;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The font every label is drawn with.
static FONT: &[u8] = include_bytes!("../assets/fonts/Go-Regular.ttf");
const FAMILY: &str = "sans-serif";
/// The size of one chart, in pixels.
const CELL: (u32, u32) = (560, 400);
/// Height of the figure's title row.
const TITLE_H: u32 = 44;
/// At most this many charts are drawn (the rest are named in a warning).
const MAX_CHARTS: usize = 48;
/// Folders deeper than this under a LOGDIR are not searched for runs.
const MAX_DEPTH: usize = 8;
/// Matplotlib's "tab10" colours, one per run.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// One run: its name and, per tag, the (step, value) points in step order.
struct Run {
    name: String,
    series: BTreeMap<String, Vec<(i64, f64)>>,
}

/// One chart: its title and its lines (legend label, points).
struct Chart<'a> {
    title: String,
    lines: Vec<(String, &'a [(i64, f64)])>,
}

/// The charts for `tags` (sorted): one per prefix before a tag's last `/`, or per tag that has
/// none. A line's label is the rest of its tag, with the run's name when there are several
/// runs (or when that is all that tells the lines apart).
fn charts<'a>(runs: &'a [Run], tags: &[String]) -> Vec<Chart<'a>> {
    fn group_of(t: &str) -> (&str, Option<&str>) {
        match t.rsplit_once('/') {
            Some((g, s)) if !g.is_empty() && !s.is_empty() => (g, Some(s)),
            _ => (t, None),
        }
    }
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for t in tags {
        groups.entry(group_of(t).0).or_default().push(t);
    }
    let several = runs.len() > 1;
    groups
        .into_iter()
        .map(|(title, members)| {
            let mut lines = Vec::new();
            for t in &members {
                // The bare tag `loss` beside `loss/val` is labelled `loss`.
                let part = group_of(t).1.or((members.len() > 1).then_some(*t));
                for r in runs {
                    if let Some(p) = r.series.get(*t) {
                        let label = match part {
                            Some(s) if several => format!("{} {s}", r.name),
                            Some(s) => s.to_string(),
                            None => r.name.clone(),
                        };
                        lines.push((label, p.as_slice()));
                    }
                }
            }
            Chart { title: title.to_string(), lines }
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Png,
    Svg,
    /// The points themselves: `run,tag,step,value` lines.
    Csv,
}

/// `msl plot`: exit status 0, or 2 with a message when there is nothing to draw or the picture
/// cannot be written.
pub fn plot_cmd(logdirs: &[PathBuf], output: &Path, tags: &[String], log_y: bool) -> u8 {
    match plot(logdirs, output, tags, log_y) {
        Ok(summary) => {
            eprintln!("{summary}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

fn plot(logdirs: &[PathBuf], output: &Path, only: &[String], log_y: bool) -> Result<String, String> {
    let format = match output.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("png") => Format::Png,
        Some("svg") => Format::Svg,
        Some("csv") => Format::Csv,
        _ => {
            return Err(format!(
                "cannot write `{}`: the picture must be a `.png` or `.svg` file (or `.csv` for the data)",
                output.display()
            ))
        }
    };
    let mut runs: Vec<Run> = Vec::new();
    for root in logdirs {
        let found = find_runs(root)?;
        if found.is_empty() {
            return Err(format!(
                "no TensorBoard event files (`events.out.tfevents.*`) under `{}`; `msl run` writes them \
                 into `runs/<program>` (or `--logdir`) when the program calls `log_scalar`",
                root.display()
            ));
        }
        for (dir, files) in found {
            // `msl plot .` names its runs `a`, `b`, not `./a`, `./b`.
            let name = match dir.strip_prefix(".") {
                Ok(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
                _ => dir.display().to_string(),
            };
            if runs.iter().any(|r| r.name == name) {
                continue;
            }
            let run = read_run(name, &files);
            if !run.series.is_empty() {
                runs.push(run);
            }
        }
    }
    if runs.is_empty() {
        let dirs: Vec<String> = logdirs.iter().map(|d| format!("`{}`", d.display())).collect();
        return Err(format!("the event files under {} hold no scalars", dirs.join(", ")));
    }
    let all: BTreeSet<&String> = runs.iter().flat_map(|r| r.series.keys()).collect();
    for t in only {
        if !all.contains(t) {
            let names: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
            return Err(format!("no tag `{t}` was logged (the tags: {})", names.join(", ")));
        }
    }
    let tags: Vec<String> = all.into_iter().filter(|t| only.is_empty() || only.contains(t)).cloned().collect();
    let mut charts = charts(&runs, &tags);
    if charts.len() > MAX_CHARTS {
        eprintln!(
            "warning: {} charts to draw; drawing the first {MAX_CHARTS} (choose tags with `--tag`)",
            charts.len()
        );
        charts.truncate(MAX_CHARTS);
    }
    let n = charts.len();
    let cols = match n {
        0..=3 => n.max(1),
        4 => 2,
        _ => 3,
    };
    let rows = n.div_ceil(cols);
    let size = (CELL.0 * cols as u32, CELL.1 * rows as u32 + TITLE_H);
    register_font()?;
    let title = figure_title(&runs);
    let write_err = |e: std::io::Error| format!("cannot write `{}`: {e}", output.display());
    match format {
        Format::Png => {
            let mut buf = vec![0u8; size.0 as usize * size.1 as usize * 3];
            draw(BitMapBackend::with_buffer(&mut buf, size).into_drawing_area(), &title, &charts, cols, log_y)?;
            let file = std::fs::File::create(output).map_err(write_err)?;
            let mut enc = png::Encoder::new(std::io::BufWriter::new(file), size.0, size.1);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            enc.set_compression(png::Compression::High);
            let mut w = enc.write_header().map_err(|e| format!("cannot write `{}`: {e}", output.display()))?;
            w.write_image_data(&buf).map_err(|e| format!("cannot write `{}`: {e}", output.display()))?;
            w.finish().map_err(|e| format!("cannot write `{}`: {e}", output.display()))?;
        }
        Format::Csv => {
            let mut csv = String::from("run,tag,step,value\n");
            for r in &runs {
                for (tag, pts) in r.series.iter().filter(|(t, _)| tags.contains(t)) {
                    for (step, v) in pts {
                        csv.push_str(&format!("{},{},{step},{}\n", csv_field(&r.name), csv_field(tag), number(*v)));
                    }
                }
            }
            std::fs::write(output, csv).map_err(write_err)?;
        }
        Format::Svg => {
            let mut svg = String::new();
            draw(SVGBackend::with_string(&mut svg, size).into_drawing_area(), &title, &charts, cols, log_y)?;
            std::fs::write(output, svg).map_err(write_err)?;
        }
    }
    let count = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
    let drawn = if format == Format::Csv { count(tags.len(), "tag") } else { count(n, "chart") };
    Ok(format!("wrote {} ({drawn}, {})", output.display(), count(runs.len(), "run")))
}

/// The folders under `root` (itself included) that hold event files, with those files in name
/// order. A file given as `root` is a run of its own. Links to folders are not followed, so a
/// cycle of links cannot make the search endless.
fn find_runs(root: &Path) -> Result<Vec<(PathBuf, Vec<PathBuf>)>, String> {
    let meta = std::fs::metadata(root).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("`{}` does not exist", root.display()),
        _ => format!("cannot read `{}`: {e}", root.display()),
    })?;
    if meta.is_file() {
        return Ok(vec![(root.to_path_buf(), vec![root.to_path_buf()])]);
    }
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            eprintln!("warning: cannot read the folder `{}`; skipped", dir.display());
            continue;
        };
        let mut files = Vec::new();
        let mut subdirs = Vec::new();
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() && depth < MAX_DEPTH {
                subdirs.push(p);
            } else if !ft.is_dir() && e.file_name().to_string_lossy().contains("tfevents") {
                files.push(p);
            }
        }
        files.sort();
        subdirs.sort();
        if !files.is_empty() {
            out.push((dir, files));
        }
        stack.extend(subdirs.into_iter().rev().map(|d| (d, depth + 1)));
    }
    Ok(out)
}

/// Reads a run's files in order. A tag whose step goes back (a run restarted into the same
/// folder) loses its points at and after that step, as TensorBoard purges them.
fn read_run(name: String, files: &[PathBuf]) -> Run {
    let mut series: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for f in files {
        let ev = match tfevents::read_events(f) {
            Ok(ev) => ev,
            Err(e) => {
                eprintln!("warning: cannot read `{}`: {e}; skipped", f.display());
                continue;
            }
        };
        if let Some(p) = ev.problem {
            eprintln!("warning: `{}`: {p}; what comes after it is not drawn", f.display());
        }
        for s in ev.scalars {
            let pts = series.entry(s.tag).or_default();
            if pts.last().is_some_and(|&(last, _)| s.step < last) {
                pts.retain(|&(step, _)| step < s.step);
            }
            pts.push((s.step, s.value));
        }
    }
    for pts in series.values_mut() {
        pts.sort_by_key(|&(step, _)| step);
    }
    Run { name, series }
}

fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("internal error: the font shipped with msl cannot be loaded".into())
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// "runs/mlp", or the runs listed while they fit on one line.
fn figure_title(runs: &[Run]) -> String {
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    let all = names.join(", ");
    if all.chars().count() <= 90 {
        all
    } else {
        format!("{} runs", runs.len())
    }
}

/// Values are drawn within ±1e300, so the span of an axis is always a finite number.
fn clamp(v: f64) -> f64 {
    v.clamp(-1e300, 1e300)
}

/// The range of an axis holding `lo..=hi`, padded, never empty.
fn axis_range(lo: f64, hi: f64, pad: f64) -> (f64, f64) {
    let (lo, hi) = (clamp(lo), clamp(hi));
    let scale = lo.abs().max(hi.abs());
    if hi - lo <= scale * 1e-9 {
        let w = (scale * 0.05).max(0.5);
        return (lo - w, hi + w);
    }
    let p = (hi - lo) * pad;
    (lo - p, hi + p)
}

/// A tick label: integers without decimals, other numbers with as many decimals as the axis'
/// span needs, very large or small ones in scientific notation.
fn tick(v: f64, span: f64) -> String {
    // Ticks are about a tenth of the span apart (1, 2 or 5 times a power of ten): a twentieth
    // of it is the last digit a label needs.
    let last = (span / 20.0).log10().floor();
    let mag = v.abs();
    if mag < span * 1e-9 {
        return "0".into();
    }
    let s = if mag >= 1e6 || span < 1e-4 {
        let digits = (mag.log10().floor() - last).clamp(2.0, 9.0) as usize;
        let s = format!("{v:.digits$e}");
        match s.split_once('e') {
            Some((m, e)) if m.contains('.') => format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.')),
            _ => s,
        }
    } else {
        let decimals = (-last).clamp(0.0, 7.0) as usize;
        let s = format!("{v:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// A value of the CSV output: the shortest text that reads back as the same number (as an
/// `f32` when it is one, as TensorBoard's values are).
fn number(v: f64) -> String {
    let single = f64::from(v as f32).to_bits() == v.to_bits();
    let scientific = v.is_finite() && v != 0.0 && !(1e-5..1e16).contains(&v.abs());
    match (single, scientific) {
        (true, true) => format!("{:e}", v as f32),
        (true, false) => format!("{}", v as f32),
        (false, true) => format!("{v:e}"),
        (false, false) => format!("{v}"),
    }
}

/// A label of a logarithmic axis: plain for numbers between 0.001 and 100,000, else in
/// scientific notation.
fn log_tick(v: f64) -> String {
    if (1e-3..1e5).contains(&v) {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.0e}")
    }
}

/// The corner of a chart with the fewest points near it, for the legend.
fn legend_corner(points: &[(f64, f64)], x: (f64, f64), y: (f64, f64)) -> SeriesLabelPosition {
    let near = |right: bool, top: bool| {
        points
            .iter()
            .filter(|&&(px, py)| {
                let fx = (px - x.0) / (x.1 - x.0);
                let fy = (py - y.0) / (y.1 - y.0);
                (if right { fx > 0.55 } else { fx < 0.45 }) && (if top { fy > 0.65 } else { fy < 0.35 })
            })
            .count()
    };
    let corners = [
        (SeriesLabelPosition::UpperRight, near(true, true)),
        (SeriesLabelPosition::UpperLeft, near(false, true)),
        (SeriesLabelPosition::LowerRight, near(true, false)),
        (SeriesLabelPosition::LowerLeft, near(false, false)),
    ];
    corners.into_iter().min_by_key(|&(_, n)| n).map_or(SeriesLabelPosition::UpperRight, |(p, _)| p)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    charts: &[Chart],
    cols: usize,
    log_y: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("cannot draw the plot: {e}");
    root.fill(&WHITE).map_err(e)?;
    let body = root.titled(title, (FAMILY, 24).into_font().color(&BLACK)).map_err(e)?;
    let rows = charts.len().div_ceil(cols);
    let cells = body.split_evenly((rows, cols));
    for (chart, cell) in charts.iter().zip(cells.iter()) {
        draw_chart(cell, chart, log_y).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// One chart: its lines against the step, on a linear or (`log_y`) a logarithmic value axis.
fn draw_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: &Chart,
    log_y: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // What can be drawn: finite values, and on a log axis positive ones; the rest are gaps.
    let shown = |v: f64| v.is_finite() && (!log_y || v > 0.0);
    let visible: Vec<(f64, f64)> = c
        .lines
        .iter()
        .flat_map(|(_, p)| p.iter())
        .filter(|(_, v)| shown(*v))
        .map(|&(s, v)| (s as f64, clamp(v)))
        .collect();
    let fold = |f: &dyn Fn(&(f64, f64)) -> f64| {
        visible.iter().map(f).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (xs, ys) = if visible.is_empty() {
        ((0.0, 1.0), if log_y { (1.0, 10.0) } else { (0.0, 1.0) })
    } else {
        (fold(&|p| p.0), fold(&|p| p.1))
    };
    let x = axis_range(xs.0, xs.1, 0.0);
    let y = if log_y {
        let (a, b) = axis_range(ys.0.max(1e-300).log10(), ys.1.max(1e-300).log10(), 0.06);
        (10f64.powf(a), 10f64.powf(b))
    } else {
        axis_range(ys.0, ys.1, 0.06)
    };
    let yspan = y.1 - y.0;
    let yfmt = move |v: &f64| if log_y { log_tick(*v) } else { tick(*v, yspan) };
    // Room for the widest value label beside the axis' name.
    let widest = [y.0, y.1, (y.0 + y.1) / 2.0].iter().map(|v| yfmt(v).chars().count()).max().unwrap_or(4);
    let mut builder = ChartBuilder::on(area);
    builder.caption(&c.title, (FAMILY, 21)).margin(14).x_label_area_size(44).y_label_area_size(30 + 9 * widest as u32);
    let corner = if log_y {
        let logs: Vec<(f64, f64)> = visible.iter().map(|&(s, v)| (s, v.log10())).collect();
        legend_corner(&logs, x, (y.0.log10(), y.1.log10()))
    } else {
        legend_corner(&visible, x, y)
    };
    let pts = Points { chart: c, shown: &shown, corner, x };
    if log_y {
        let chart = builder.build_cartesian_2d(x.0..x.1, (y.0..y.1).log_scale())?;
        finish_chart(chart, &pts, &yfmt)
    } else {
        let chart = builder.build_cartesian_2d(x.0..x.1, y.0..y.1)?;
        finish_chart(chart, &pts, &yfmt)
    }
}

/// What `finish_chart` draws: the chart's lines, which values show, and the axes' ranges.
struct Points<'a> {
    chart: &'a Chart<'a>,
    shown: &'a dyn Fn(f64) -> bool,
    /// Where the legend covers the fewest points.
    corner: SeriesLabelPosition,
    x: (f64, f64),
}

/// The mesh, the lines (with a dot per point when there are few) and the legend, on either
/// kind of value axis.
fn finish_chart<'a, DB: DrawingBackend + 'a, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    p: &Points,
    yfmt: &dyn Fn(&f64) -> String,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let xspan = p.x.1 - p.x.0;
    let xfmt =
        move |v: &f64| if xspan >= 5.0 && v.abs() < 1e6 { format!("{}", v.round() as i64) } else { tick(*v, xspan) };
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(p.chart.title.as_str())
        .x_labels(6)
        .y_labels(6)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(WHITE)
        .axis_style(RGBColor(90, 90, 90))
        .draw()?;
    for (i, (label, pts)) in p.chart.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: 2 };
        // A value that cannot be shown (NaN, an infinity, ≤ 0 on a log axis) is a gap.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for &(s, v) in pts.iter() {
            match ((p.shown)(v), segments.last_mut()) {
                (true, Some(seg)) => seg.push((s as f64, clamp(v))),
                (false, Some(seg)) if !seg.is_empty() => segments.push(Vec::new()),
                _ => {}
            }
        }
        let n_points: usize = segments.iter().map(Vec::len).sum();
        for (k, seg) in segments.iter().enumerate() {
            let series = chart.draw_series(LineSeries::new(seg.iter().copied(), style))?;
            if k == 0 {
                series
                    .label(label.as_str())
                    .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 22, ly)], style));
            }
            if n_points <= 60 {
                chart.draw_series(seg.iter().map(|&q| Circle::new(q, 3, color.filled())))?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(p.corner.clone())
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 15))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_fit_the_span() {
        assert_eq!(tick(0.25, 1.0), "0.25");
        assert_eq!(tick(0.30000000000000004, 1.0), "0.3");
        assert_eq!(tick(-28.80415, 0.0003), "-28.80415");
        assert_eq!(tick(2.0, 10.0), "2");
        assert_eq!(tick(0.0, 1.0), "0");
        assert_eq!(tick(1e-5, 1e-5), "1e-5");
        assert_eq!(tick(1.5e-5, 1e-5), "1.5e-5");
        assert_eq!(tick(3e7, 1e7), "3e7");
        assert_eq!(tick(1000000.125, 0.125), "1.000000125e6");
        assert_eq!(tick(-0.00000001, 1.0), "0");
        assert_eq!(tick(-0.0, 1.0), "0");
    }

    #[test]
    fn csv_numbers_read_back_exactly() {
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::from(1000000.1f32)), "1000000.1");
        assert_eq!(number(f64::from(3e38f32)), "3e38");
        assert_eq!(number(0.1), "0.1");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn axis_ranges_are_never_empty_or_infinite() {
        for (lo, hi) in [(1.0, 1.0), (0.0, 0.0), (-1e308, 1e308), (1e15, 1e15 + 1.0), (f64::MAX, f64::MAX)] {
            let (a, b) = axis_range(lo, hi, 0.06);
            assert!(a.is_finite() && b.is_finite() && a < b, "{lo}..{hi} gave {a}..{b}");
        }
    }
}
