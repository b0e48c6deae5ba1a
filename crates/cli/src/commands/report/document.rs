//! A report as data (sections of text, tables and figures) and its two
//! renderings: `report.md` beside `figures/*.png`, and a self-contained
//! `report.html` with the same figures embedded as base64 data URIs.

use std::fs;
use std::path::Path;

use anyhow::Context;
use base64::Engine;

/// A PNG figure and its caption.
#[derive(Debug, Clone)]
pub struct Figure {
    /// File name under `figures/` (`learning-curves.png`).
    pub file: String,
    pub caption: String,
    pub png: Vec<u8>,
}

/// A table of text cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// One section: a heading, paragraphs, tables, figures, in that order.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub heading: String,
    pub paragraphs: Vec<String>,
    pub tables: Vec<Table>,
    pub figures: Vec<Figure>,
}

/// A whole report.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub title: String,
    pub sections: Vec<Section>,
}

impl Report {
    /// Every figure of every section.
    pub fn figures(&self) -> impl Iterator<Item = &Figure> {
        self.sections.iter().flat_map(|s| s.figures.iter())
    }

    /// The Markdown text (figures linked as `figures/FILE`).
    pub fn markdown(&self) -> String {
        let mut s = format!("# {}\n", self.title);
        for section in &self.sections {
            s.push_str(&format!("\n## {}\n", section.heading));
            for p in &section.paragraphs {
                s.push_str(&format!("\n{p}\n"));
            }
            for t in &section.tables {
                s.push('\n');
                s.push_str(&markdown_table(t));
            }
            for f in &section.figures {
                s.push_str(&format!("\n![{}](figures/{})\n", f.caption, f.file));
            }
        }
        s
    }

    /// A self-contained HTML page: the same content, figures inline.
    pub fn html(&self) -> String {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut s = format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n{}\n</style>\n</head>\n<body>\n<h1>{}</h1>\n",
            escape(&self.title),
            STYLE,
            escape(&self.title)
        );
        for section in &self.sections {
            s.push_str(&format!("<h2>{}</h2>\n", escape(&section.heading)));
            for p in &section.paragraphs {
                s.push_str(&format!("<p>{}</p>\n", escape(p)));
            }
            for t in &section.tables {
                s.push_str(&html_table(t));
            }
            for f in &section.figures {
                s.push_str(&format!(
                    "<figure><img alt=\"{}\" src=\"data:image/png;base64,{}\"><figcaption>{}</figcaption></figure>\n",
                    escape(&f.caption),
                    b64.encode(&f.png),
                    escape(&f.caption)
                ));
            }
        }
        s.push_str("</body>\n</html>\n");
        s
    }

    /// Write `report.md`, `figures/*.png` and `report.html` into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let figures = dir.join("figures");
        fs::create_dir_all(&figures)
            .with_context(|| format!("cannot create {}", figures.display()))?;
        for f in self.figures() {
            let p = figures.join(&f.file);
            fs::write(&p, &f.png).with_context(|| format!("cannot write {}", p.display()))?;
        }
        for (name, text) in [("report.md", self.markdown()), ("report.html", self.html())] {
            let p = dir.join(name);
            fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    }
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}\
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}\
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:0.9em}";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A Markdown table (pipes in cells escaped).
pub fn markdown_table(t: &Table) -> String {
    let cell = |c: &str| c.replace('|', "\\|");
    let mut s = format!(
        "| {} |\n|{}\n",
        t.headers
            .iter()
            .map(|h| cell(h))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(t.headers.len())
    );
    for row in &t.rows {
        s.push_str(&format!(
            "| {} |\n",
            row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
        ));
    }
    s
}

fn html_table(t: &Table) -> String {
    let mut s = String::from("<table>\n<tr>");
    for h in &t.headers {
        s.push_str(&format!("<th>{}</th>", escape(h)));
    }
    s.push_str("</tr>\n");
    for row in &t.rows {
        s.push_str("<tr>");
        for c in row {
            s.push_str(&format!("<td>{}</td>", escape(c)));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            title: "run <x>".into(),
            sections: vec![Section {
                heading: "Summary".into(),
                paragraphs: vec!["a & b".into()],
                tables: vec![Table {
                    headers: vec!["env".into(), "success".into()],
                    rows: vec![vec!["a|b".into(), "10.0%".into()]],
                }],
                figures: vec![Figure {
                    file: "f.png".into(),
                    caption: "curves".into(),
                    png: vec![1, 2, 3],
                }],
            }],
        }
    }

    #[test]
    fn markdown_and_html_hold_the_same_content() {
        let r = report();
        let md = r.markdown();
        assert!(md.starts_with("# run <x>\n"));
        assert!(
            md.contains("| env | success |\n|---|---|\n| a\\|b | 10.0% |\n"),
            "{md}"
        );
        assert!(md.contains("![curves](figures/f.png)"));
        let html = r.html();
        assert!(html.contains("<h1>run &lt;x&gt;</h1>"));
        assert!(html.contains("<p>a &amp; b</p>"));
        assert!(html.contains("<td>a|b</td><td>10.0%</td>"));
        // The figure is inline: the page needs no other file.
        assert!(
            html.contains("src=\"data:image/png;base64,AQID\""),
            "{html}"
        );
    }

    #[test]
    fn write_puts_the_figures_beside_the_markdown() {
        let dir = tempfile::tempdir().unwrap();
        report().write(dir.path()).unwrap();
        assert_eq!(
            fs::read(dir.path().join("figures/f.png")).unwrap(),
            [1, 2, 3]
        );
        assert!(dir.path().join("report.md").is_file());
        assert!(dir.path().join("report.html").is_file());
    }
}
