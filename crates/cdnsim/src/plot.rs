//! PNG plots of a run and of a sweep (plotters, drawn into a bitmap): CDFs
//! of start-up delay and buffering ratio, concurrent caches over time, and
//! a sweep's start-up CDF per boot time (the paper's Figure 2). Text needs a
//! TrueType font: one found on the system (Debian's fonts-dejavu-core) or
//! named with `--font`, looked for before a run starts so that a long run
//! never ends without its plots.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::FontStyle;

/// Where a font usually is: Debian's (and Fedora's, Arch's) DejaVu Sans,
/// then Liberation Sans.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// The family plots ask for.
const FAMILY: &str = "sans-serif";

/// Load the font for the plots' text: `path`, or the first of [`FONTS`]
/// there is. Call once, before drawing.
pub fn load_font(path: Option<&Path>) -> Result<PathBuf, String> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => FONTS.iter().map(PathBuf::from).find(|p| p.is_file()).ok_or_else(|| {
            format!("no font for the plots' text (looked for {}): install fonts-dejavu-core, name one with --font FILE, or leave the plots out with --no-plots", FONTS.join(", "))
        })?,
    };
    let bytes = std::fs::read(&path).map_err(|e| format!("font {}: {e}", path.display()))?;
    // plotters keeps fonts for the program's life.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).map_err(|_| format!("font {}: not a TrueType or OpenType font", path.display()))?;
    Ok(path)
}

/// Up to `n` points of the CDF of `values`: (value, fraction at or below).
pub fn cdf(values: &[f64], n: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Vec::new();
    }
    v.sort_by(f64::total_cmp);
    let len = v.len();
    let step = len.div_ceil(n.max(2)).max(1);
    let mut out: Vec<(f64, f64)> = (0..len).step_by(step).map(|i| (v[i], (i + 1) as f64 / len as f64)).collect();
    out.push((v[len - 1], 1.0));
    out
}

const COLOURS: [RGBColor; 7] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40), RGBColor(148, 103, 189), RGBColor(140, 86, 75), RGBColor(0, 0, 0)];

fn err(path: &Path) -> impl Fn(String) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

/// Lines (name, points) on linear axes, x from 0 to `x_max`; a legend when
/// there is more than one.
fn lines(path: &Path, title: &str, x_desc: &str, y_desc: &str, x_max: f64, y_max: f64, series: &[(String, Vec<(f64, f64)>)]) -> Result<(), String> {
    let e = err(path);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let x_max = if x_max > 0.0 && x_max.is_finite() { x_max } else { 1.0 };
    let y_max = if y_max > 0.0 && y_max.is_finite() { y_max } else { 1.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|x| e(x.to_string()))?;
    // Counts as integers, fractions with two decimals.
    let y_label = |y: &f64| if y_max > 2.0 { format!("{y:.0}") } else { format!("{y:.2}") };
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).label_style((FAMILY, 15)).y_label_formatter(&y_label).draw().map_err(|x| e(x.to_string()))?;
    for (k, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
            .map_err(|x| e(x.to_string()))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    if series.len() > 1 {
        chart.configure_series_labels().position(SeriesLabelPosition::LowerRight).label_font((FAMILY, 15)).background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(|x| e(x.to_string()))?;
    }
    root.present().map_err(|x| e(x.to_string()))
}

/// The CDFs of `series` (name, values) in one plot, x up to the largest
/// of their 99th percentiles (a long tail would squash the rest; the line
/// ends at the plot's edge).
pub fn cdf_plot(path: &Path, title: &str, x_desc: &str, series: &[(String, &[f64])]) -> Result<(), String> {
    let curves: Vec<(String, Vec<(f64, f64)>)> = series.iter().map(|(n, v)| (n.clone(), cdf(v, 2000))).collect();
    let x_max = curves.iter().filter_map(|(_, c)| c.iter().find(|p| p.1 >= 0.99).map(|p| p.0)).fold(0.0, f64::max);
    let x_max = if x_max > 0.0 { x_max * 1.05 } else { curves.iter().filter_map(|(_, c)| c.last().map(|p| p.0)).fold(0.0, f64::max).max(1e-3) };
    let clipped: Vec<(String, Vec<(f64, f64)>)> = curves.into_iter().map(|(n, c)| (n, c.into_iter().map(|(x, y)| (x.min(x_max), y)).collect())).collect();
    lines(path, title, x_desc, "fraction of viewers", x_max, 1.0, &clipped)
}

/// The most caches at once in each of `slices` equal slices of the run
/// (from 0 to the last change), from `steps` of (seconds, caches) at each
/// change: (slice start in hours, most). A slice with no change holds the
/// count it starts with.
pub fn most_per_slice(steps: &[(f64, u32)], slices: usize) -> Vec<(f64, f64)> {
    let end = steps.last().map_or(1.0, |s| s.0).max(1e-9);
    let width = end / slices as f64;
    let mut points = Vec::with_capacity(slices + 1);
    let (mut i, mut now) = (0, 0u32);
    for k in 0..=slices {
        let slice_end = (k + 1) as f64 * width;
        let mut most = now;
        while i < steps.len() && steps[i].0 < slice_end {
            now = steps[i].1;
            most = most.max(now);
            i += 1;
        }
        points.push((k as f64 * width / 3600.0, most as f64));
    }
    points
}

/// Caches running over time (`steps` as [`most_per_slice`] takes them),
/// drawn as the most in each of 2,000 slices: a million viewers' run has
/// ~60,000 changes, and a pixel column holds many.
pub fn caches_plot(path: &Path, steps: &[(f64, u32)]) -> Result<(), String> {
    let points = most_per_slice(steps, 2000);
    let end = points.last().map_or(1.0, |p| p.0);
    let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.05;
    lines(path, "Caches running (the most in each slice of the run)", "hours", "caches", end.max(1e-6), y_max.max(1.0), &[("caches".into(), points)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cdf_rises_to_one_through_the_sorted_values() {
        let c = cdf(&[3.0, 1.0, 2.0, 4.0], 100);
        assert_eq!(c, [(1.0, 0.25), (2.0, 0.5), (3.0, 0.75), (4.0, 1.0), (4.0, 1.0)]);
        // Thinned to about n points, still ending at the largest value.
        let v: Vec<f64> = (0..10_000).map(f64::from).collect();
        let c = cdf(&v, 100);
        assert!(c.len() <= 102 && c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(c.last(), Some(&(9999.0, 1.0)));
        assert!(cdf(&[f64::NAN], 10).is_empty());
    }

    #[test]
    fn each_slice_holds_the_most_at_once() {
        // 1 cache at 0 s, 3 at 1 s, 2 at 1.5 s, 0 at 4 s: four slices of 1 s.
        let p = most_per_slice(&[(0.0, 1), (1.0, 3), (1.5, 2), (4.0, 0)], 4);
        let most: Vec<f64> = p.iter().map(|x| x.1).collect();
        assert_eq!(most, [1.0, 3.0, 2.0, 2.0, 2.0]);
        assert_eq!(p[2].0, 2.0 / 3600.0);
    }
}
