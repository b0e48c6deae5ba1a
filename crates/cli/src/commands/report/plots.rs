//! PNG figures for `agentrl report`: line panels, grouped bars and a
//! heatmap, drawn with plotters' bitmap backend into a buffer and encoded
//! with `png`. Text uses DejaVu Sans Mono, embedded in the binary, so a
//! report looks the same on every machine and needs no system fonts.

use std::sync::Once;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// DejaVu Sans Mono (Bitstream Vera license, `assets/DejaVu-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../../assets/DejaVuSansMono.ttf");
/// The family every text of a figure is drawn in.
const FAMILY: &str = "sans-serif";

static REGISTER_FONT: Once = Once::new();

/// Registers the embedded font as the family every plotters text uses by
/// default; call it before drawing any text (plotters has no font of its
/// own, and a machine may have none).
pub(crate) fn register_font() {
    REGISTER_FONT.call_once(|| {
        // The font is a constant of the binary: it parses or the build is broken.
        if plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            panic!("the embedded DejaVu Sans Mono font does not parse");
        }
    });
}

/// Series colours, distinguishable and print-safe (Tableau 10).
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

/// The colour of series `i`.
pub fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// One named series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a line figure.
#[derive(Debug, Clone)]
pub struct LinePanel {
    pub title: String,
    pub x_label: String,
    pub series: Vec<Series>,
}

/// Black text of `size` pixels in the registered font.
fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(&BLACK)
}

/// A chart's title, centred at the top of its `width` pixels.
fn draw_title(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    width: u32,
) -> anyhow::Result<()> {
    let style = text(17).pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(title.to_string(), (width as i32 / 2, 12), style))?;
    Ok(())
}

/// Render `width × height` pixels with `draw`, then encode them as PNG.
fn render(
    width: u32,
    height: u32,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<u8>> {
    register_font();
    let mut rgb = vec![255u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    let mut png_bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut png_bytes, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().context("PNG header")?;
        writer.write_image_data(&rgb).context("PNG data")?;
    }
    Ok(png_bytes)
}

/// Panels of line series side by side (`columns` per row), each with its
/// own axes and a legend when it has several series.
pub fn line_panels(panels: &[LinePanel], columns: usize) -> anyhow::Result<Vec<u8>> {
    let columns = columns.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(columns).max(1);
    let (w, h) = (460 * columns as u32, 340 * rows as u32);
    render(w, h, |root| {
        let areas = root.split_evenly((rows, columns));
        for (area, panel) in areas.iter().zip(panels) {
            line_panel(area, panel)?;
        }
        Ok(())
    })
}

fn line_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    panel: &LinePanel,
) -> anyhow::Result<()> {
    let all = panel.series.iter().flat_map(|s| s.points.iter());
    let x_min = all.clone().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = all.clone().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y_max = all.clone().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let y_min = all.map(|p| p.1).fold(f64::INFINITY, f64::min);
    let (x_min, x_max) = match x_min.is_finite() {
        true if x_max > x_min => (x_min, x_max),
        true => (x_min - 1.0, x_max + 1.0),
        false => (0.0, 1.0),
    };
    let y_min = if y_min.is_finite() {
        y_min.min(0.0)
    } else {
        0.0
    };
    let y_max = if y_max.is_finite() && y_max > y_min {
        y_max + 0.05 * (y_max - y_min)
    } else {
        y_min + 1.0
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FAMILY, 17))
        .margin(10)
        .x_label_area_size(34)
        .y_label_area_size(52)
        .build_cartesian_2d(x_min..x_max, y_min..y_max)?;
    chart
        .configure_mesh()
        .x_desc(&panel.x_label)
        .label_style((FAMILY, 12))
        .axis_desc_style((FAMILY, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (i, s) in panel.series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(s.points.clone(), c.stroke_width(2)))?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        // Points too: a series measured a few times is still visible.
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    if panel.series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FAMILY, 12))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    Ok(())
}

/// Grouped vertical bars: one group per category, one bar per series, on
/// a 0..`y_max` axis, each bar labelled with its value (`percent`: as %).
pub fn grouped_bars(
    title: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
    y_max: f64,
    percent: bool,
) -> anyhow::Result<Vec<u8>> {
    let groups = categories.len().max(1);
    let bars = series.len().max(1);
    let width = (140 + groups * (bars * 34 + 26)).clamp(520, 1800) as u32;
    let height = 440;
    render(width, height, |root| {
        let (left, right, top, bottom) = (60i32, width as i32 - 20, 44i32, height as i32 - 110);
        draw_title(root, title, width)?;
        // A value as the bars show it: a percentage (with `unit`), or two decimals.
        let value_text = |v: f64, unit: &str| match percent {
            true => format!("{:.0}{unit}", 100.0 * v),
            false => format!("{v:.2}"),
        };
        let y_max = if y_max > 0.0 { y_max } else { 1.0 };
        let y_of = |v: f64| bottom - ((v / y_max).clamp(0.0, 1.0) * (bottom - top) as f64) as i32;
        // Axis and gridlines at fifths.
        for i in 0..=5 {
            let v = y_max * i as f64 / 5.0;
            let y = y_of(v);
            root.draw(&PathElement::new(
                vec![(left, y), (right, y)],
                RGBColor(225, 225, 225),
            ))?;
            root.draw(&Text::new(
                value_text(v, "%"),
                (left - 6, y),
                text(12).pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
        }
        root.draw(&PathElement::new(
            vec![(left, top), (left, bottom), (right, bottom)],
            BLACK,
        ))?;
        let group_w = (right - left) as f64 / groups as f64;
        let bar_w = ((group_w - 16.0) / bars as f64).max(4.0);
        for (g, category) in categories.iter().enumerate() {
            let x0 = left as f64 + g as f64 * group_w + 8.0;
            for (b, (_, values)) in series.iter().enumerate() {
                let v = values.get(g).copied().unwrap_or(0.0);
                let bx0 = (x0 + b as f64 * bar_w) as i32;
                let bx1 = (x0 + (b + 1) as f64 * bar_w) as i32 - 2;
                root.draw(&Rectangle::new(
                    [(bx0, y_of(v)), (bx1, bottom)],
                    color(b).filled(),
                ))?;
                root.draw(&Text::new(
                    value_text(v, ""),
                    ((bx0 + bx1) / 2, y_of(v) - 2),
                    text(10).pos(Pos::new(HPos::Center, VPos::Bottom)),
                ))?;
            }
            let fits = ((group_w / 7.5) as usize).max(6);
            for (i, line) in wrap(category, fits).into_iter().enumerate() {
                root.draw(&Text::new(
                    line,
                    (
                        (x0 + group_w / 2.0 - 8.0) as i32,
                        bottom + 6 + 14 * i as i32,
                    ),
                    text(12).pos(Pos::new(HPos::Center, VPos::Top)),
                ))?;
            }
        }
        // Legend under the axis and its labels.
        let mut x = left;
        for (b, (name, _)) in series.iter().enumerate() {
            root.draw(&Rectangle::new(
                [(x, bottom + 52), (x + 12, bottom + 64)],
                color(b).filled(),
            ))?;
            root.draw(&Text::new(
                name.clone(),
                (x + 16, bottom + 58),
                text(12).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
            x += 24 + 8 * name.chars().count() as i32;
            if x > right - 100 && b + 1 < series.len() {
                x = left;
            }
        }
        Ok(())
    })
}

/// A heatmap of `values` (rows × columns, `None` = not measured), each cell
/// coloured on a blue–white–red scale around 0 when `diverging` (a Δ), or
/// white to blue over 0..1 otherwise, with its value printed in it.
pub fn heatmap(
    title: &str,
    rows: &[String],
    columns: &[String],
    values: &[Vec<Option<f64>>],
    diverging: bool,
) -> anyhow::Result<Vec<u8>> {
    let label_w = rows.iter().map(|r| r.chars().count()).max().unwrap_or(4) as i32 * 8 + 20;
    let cell_w = columns
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(4)
        .max(7) as i32
        * 8
        + 16;
    let cell_h = 34;
    let title_w = title.chars().count() as i32 * 9 + 40;
    let width = (label_w + cell_w * columns.len() as i32 + 20)
        .max(title_w)
        .max(360) as u32;
    let height = (60 + 30 + cell_h * rows.len() as i32 + 20) as u32;
    let scale = values
        .iter()
        .flatten()
        .flatten()
        .map(|v| v.abs())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    render(width, height, |root| {
        draw_title(root, title, width)?;
        let top = 70;
        for (c, name) in columns.iter().enumerate() {
            root.draw(&Text::new(
                name.clone(),
                (label_w + c as i32 * cell_w + cell_w / 2, top - 8),
                text(12).pos(Pos::new(HPos::Center, VPos::Bottom)),
            ))?;
        }
        for (r, name) in rows.iter().enumerate() {
            let y = top + r as i32 * cell_h;
            root.draw(&Text::new(
                name.clone(),
                (label_w - 8, y + cell_h / 2),
                text(12).pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
            for c in 0..columns.len() {
                let x = label_w + c as i32 * cell_w;
                let v = values.get(r).and_then(|row| row.get(c)).copied().flatten();
                let fill = match v {
                    None => RGBColor(240, 240, 240),
                    Some(v) if diverging => diverging_color(v / scale),
                    Some(v) => sequential_color(v.clamp(0.0, 1.0)),
                };
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell_w - 2, y + cell_h - 2)],
                    fill.filled(),
                ))?;
                let label = match (v, diverging) {
                    (None, _) => "–".to_string(),
                    (Some(v), true) => format!("{:+.1}", 100.0 * v),
                    (Some(v), false) => format!("{:.1}%", 100.0 * v),
                };
                root.draw(&Text::new(
                    label,
                    (x + cell_w / 2, y + cell_h / 2),
                    text(12).pos(Pos::new(HPos::Center, VPos::Center)),
                ))?;
            }
        }
        Ok(())
    })
}

/// `text` in lines of at most `width` characters, broken at spaces (a
/// longer word stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// White at 0, toward red for positive and blue for negative (t in −1..1).
fn diverging_color(t: f64) -> RGBColor {
    let t = t.clamp(-1.0, 1.0);
    let mix = |a: u8, b: u8, f: f64| (a as f64 + (b as f64 - a as f64) * f) as u8;
    if t >= 0.0 {
        RGBColor(mix(255, 214, t), mix(255, 96, t), mix(255, 77, t))
    } else {
        RGBColor(mix(255, 67, -t), mix(255, 147, -t), mix(255, 195, -t))
    }
}

/// White at 0 to blue at 1.
fn sequential_color(t: f64) -> RGBColor {
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * t) as u8;
    RGBColor(mix(255, 66), mix(255, 146), mix(255, 198))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_png(bytes: &[u8]) -> bool {
        bytes.starts_with(&[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a])
    }

    /// The pixel size written in a PNG's IHDR chunk.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        let be =
            |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        (be(16), be(20))
    }

    #[test]
    fn each_figure_kind_renders_a_png_of_its_size() {
        let panel = LinePanel {
            title: "validation success".into(),
            x_label: "step".into(),
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![(0.0, 0.1), (10.0, 0.3)],
                },
                Series {
                    name: "b".into(),
                    points: vec![(5.0, 0.2)],
                },
            ],
        };
        let lines = line_panels(&[panel.clone(), panel], 2).unwrap();
        assert!(is_png(&lines));
        assert_eq!(png_size(&lines), (920, 340));
        let bars = grouped_bars(
            "failure labels",
            &["frozenlake".into(), "sokoban".into()],
            &[
                ("action_loop".into(), vec![0.2, 0.5]),
                ("invalid_format".into(), vec![0.1, 0.0]),
            ],
            1.0,
            true,
        )
        .unwrap();
        assert!(is_png(&bars));
        let map = heatmap(
            "held-out Δ",
            &["trained on a".into()],
            &["a/easy".into(), "b/easy".into()],
            &[vec![Some(0.25), None]],
            true,
        )
        .unwrap();
        assert!(is_png(&map));
        // Empty inputs still draw (axes and title only).
        assert!(is_png(&line_panels(&[], 1).unwrap()));
    }

    #[test]
    fn labels_wrap_at_spaces() {
        assert_eq!(
            wrap("turn budget exhausted", 12),
            ["turn budget", "exhausted"]
        );
        assert_eq!(wrap("confirmation_bias", 6), ["confirmation_bias"]);
        assert!(wrap("", 6).is_empty());
    }

    #[test]
    fn the_colour_scales_are_white_at_zero_and_saturate() {
        assert_eq!(diverging_color(0.0), RGBColor(255, 255, 255));
        assert_eq!(diverging_color(2.0), RGBColor(214, 96, 77));
        assert_eq!(diverging_color(-1.0), RGBColor(67, 147, 195));
        assert_eq!(sequential_color(0.0), RGBColor(255, 255, 255));
        assert_eq!(sequential_color(1.0), RGBColor(66, 146, 198));
    }
}
