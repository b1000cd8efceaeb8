//! Text of produced files, for graders that read files (`evaluation.target: "file:NAME"`).
//!
//! Plain formats (`.md`, `.txt`, `.json`, `.csv`, anything else that is UTF-8) are their own
//! text; `.html` loses its tags, scripts and styles; `.docx` gives its paragraphs and `.pptx`
//! its slides' paragraphs (in slide order, each slide headed `## Slide N`), both read from the
//! OOXML parts with `zip` + `quick-xml`; `.xlsx`/`.xlsm`/`.xls`/`.ods` give each sheet as
//! tab-separated rows (`calamine`); `.pdf` gives its text (`pdf-extract`). A file that cannot
//! be read as text is an error naming the file and the reason, never silently empty.

use skilleval_model::definition::{ExpectedFile, TestCase};
use skilleval_model::output::ProducedFile;

/// What the grader reads: `Ok(None)` grades the answer, `Ok(Some(text))` a file's text.
/// `Err` says why the target cannot be read (the case then fails on it).
pub fn target_text(case: &TestCase, files: &[ProducedFile]) -> Result<Option<String>, String> {
    let Some(target) = case.evaluation.target.as_deref() else {
        return Ok(None);
    };
    if target == "output" {
        return Ok(None);
    }
    let Some(name) = target.strip_prefix("file:") else {
        return Err(format!(
            "evaluation.target `{target}` must be `output` or `file:NAME`"
        ));
    };
    let name = name
        .trim()
        .trim_start_matches("./")
        .trim_start_matches("/workspace/");
    let file = files
        .iter()
        .find(|f| f.path == name)
        .ok_or_else(|| format!("the runner left no file `{name}` to grade"))?;
    let bytes = file.content.as_deref().ok_or_else(|| {
        format!(
            "`{name}` ({} bytes) is over the kept-content budget and cannot be graded",
            file.size
        )
    })?;
    extract_text(name, bytes).map(Some)
}

/// The text of a file by its extension.
pub fn extract_text(name: &str, bytes: &[u8]) -> Result<String, String> {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let fail = |e: String| format!("`{name}`: cannot extract its text: {e}");
    match ext.as_str() {
        "html" | "htm" => Ok(html_text(&utf8(name, bytes)?)),
        "docx" => ooxml_text(bytes, |p| p == "word/document.xml", b"w:p", b"w:t").map_err(fail),
        "pptx" => pptx_text(bytes).map_err(fail),
        "xlsx" | "xlsm" | "xls" | "ods" => sheets_text(bytes).map_err(fail),
        "pdf" => pdf_extract::extract_text_from_mem(bytes).map_err(|e| fail(e.to_string())),
        _ => utf8(name, bytes),
    }
}

/// The text of the `text` elements of an XML part, a line per `para` element.
fn xml_paragraphs(xml: &[u8], para: &[u8], text: &[u8]) -> Result<String, String> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut buf = Vec::new();
    let mut out = String::new();
    let mut in_text = false;
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) if e.name().as_ref() == text => in_text = true,
            Ok(Event::End(e)) if e.name().as_ref() == text => in_text = false,
            Ok(Event::End(e)) if e.name().as_ref() == para => out.push('\n'),
            Ok(Event::Text(t)) if in_text => {
                out.push_str(&t.decode().map_err(|e| e.to_string())?);
            }
            Ok(Event::GeneralRef(r)) if in_text => {
                if let Ok(Some(c)) = r.resolve_char_ref() {
                    out.push(c);
                } else if let Ok(name) = r.decode() {
                    if let Some(s) = quick_xml::escape::resolve_predefined_entity(&name) {
                        out.push_str(s);
                    }
                }
            }
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        buf.clear();
    }
    Ok(out.trim_end().to_string())
}

/// The paragraphs of the OOXML parts `wanted` picks, in name order.
fn ooxml_text(
    bytes: &[u8],
    wanted: impl Fn(&str) -> bool,
    para: &[u8],
    text: &[u8],
) -> Result<String, String> {
    use std::io::Read;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let mut names: Vec<String> = zip
        .file_names()
        .filter_map(Result::ok)
        .map(std::borrow::Cow::into_owned)
        .filter(|n| wanted(n))
        .collect();
    if names.is_empty() {
        return Err("no document part in the archive".to_string());
    }
    names.sort_by_key(|n| (n.len(), n.clone()));
    let mut parts = Vec::new();
    for n in names {
        let mut xml = Vec::new();
        zip.by_name(&n)
            .map_err(|e| e.to_string())?
            .take(64 << 20)
            .read_to_end(&mut xml)
            .map_err(|e| e.to_string())?;
        parts.push(xml_paragraphs(&xml, para, text)?);
    }
    Ok(parts.join("\n"))
}

/// Each slide's paragraphs under a `## Slide N` heading.
fn pptx_text(bytes: &[u8]) -> Result<String, String> {
    let is_slide = |n: &str| {
        n.strip_prefix("ppt/slides/slide")
            .and_then(|r| r.strip_suffix(".xml"))
            .is_some_and(|num| !num.is_empty() && num.chars().all(|c| c.is_ascii_digit()))
    };
    // One slide at a time, so each gets its heading.
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let mut slides: Vec<(u32, String)> = zip
        .file_names()
        .filter_map(Result::ok)
        .filter(|n| is_slide(n))
        .filter_map(|n| {
            n.trim_start_matches("ppt/slides/slide")
                .trim_end_matches(".xml")
                .parse::<u32>()
                .ok()
                .map(|k| (k, n.to_string()))
        })
        .collect();
    if slides.is_empty() {
        return Err("no slides in the archive".to_string());
    }
    slides.sort();
    let mut out = Vec::new();
    for (k, n) in slides {
        use std::io::Read;
        let mut xml = Vec::new();
        zip.by_name(&n)
            .map_err(|e| e.to_string())?
            .take(64 << 20)
            .read_to_end(&mut xml)
            .map_err(|e| e.to_string())?;
        out.push(format!(
            "## Slide {k}\n{}",
            xml_paragraphs(&xml, b"a:p", b"a:t")?
        ));
    }
    Ok(out.join("\n\n"))
}

/// Every sheet as `## Sheet NAME` and tab-separated rows.
fn sheets_text(bytes: &[u8]) -> Result<String, String> {
    use calamine::Reader;
    let mut book = calamine::open_workbook_auto_from_rs(std::io::Cursor::new(bytes))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for sheet in book.sheet_names() {
        let range = book.worksheet_range(&sheet).map_err(|e| e.to_string())?;
        let rows: Vec<String> = range
            .rows()
            .map(|r| {
                r.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\t")
            })
            .collect();
        out.push(format!("## Sheet {sheet}\n{}", rows.join("\n")));
    }
    Ok(out.join("\n\n"))
}

fn utf8(name: &str, bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| format!("`{name}` is not UTF-8 text and its format has no text extractor"))
}

/// Visible text of an HTML document: tags dropped, `<script>`/`<style>` content dropped,
/// the five common entities decoded. Hand-written because graders need words, not a DOM,
/// and a browser-grade parser is far more than that asks.
fn html_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    while i < html.len() {
        if html[i..].starts_with('<') {
            let skip_to = ["script", "style"].iter().find_map(|t| {
                lower[i + 1..]
                    .starts_with(t)
                    .then(|| lower[i..].find(&format!("</{t}")).map(|e| i + e))
                    .flatten()
            });
            let from = skip_to.unwrap_or(i);
            match html[from..].find('>') {
                Some(end) => {
                    i = from + end + 1;
                    out.push(' ');
                }
                None => break,
            }
        } else {
            let next = html[i..].find('<').map_or(html.len(), |n| i + n);
            out.push_str(&html[i..next]);
            i = next;
        }
    }
    let decoded = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks `expected.files` against what the runner left: one `(path, passed, detail)` each.
pub fn check_files(
    expected: &[ExpectedFile],
    files: &[ProducedFile],
) -> Vec<(String, bool, String)> {
    expected
        .iter()
        .map(|e| {
            let path = e.path.trim_start_matches("./");
            let Some(f) = files.iter().find(|f| f.path == path) else {
                return (path.to_string(), false, "missing".to_string());
            };
            if e.min_size.is_some_and(|m| f.size < m) {
                return (
                    path.to_string(),
                    false,
                    format!(
                        "{} bytes, under the minimum {}",
                        f.size,
                        e.min_size.unwrap_or(0)
                    ),
                );
            }
            if e.max_size.is_some_and(|m| f.size > m) {
                return (
                    path.to_string(),
                    false,
                    format!(
                        "{} bytes, over the maximum {}",
                        f.size,
                        e.max_size.unwrap_or(0)
                    ),
                );
            }
            if let Some(h) = &e.sha256 {
                if !h.eq_ignore_ascii_case(&f.sha256) {
                    return (
                        path.to_string(),
                        false,
                        format!("sha256 {} is not {h}", f.sha256),
                    );
                }
            }
            (
                path.to_string(),
                true,
                format!("{} bytes, sha256 {}", f.size, f.sha256),
            )
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn zip_of(entries: &[(&str, &str)]) -> Vec<u8> {
        use std::io::Write;
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (name, content) in entries {
            w.start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(content.as_bytes()).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn docx_and_pptx_give_their_paragraphs() {
        let docx = zip_of(&[(
            "word/document.xml",
            r#"<w:document xmlns:w="x"><w:body><w:p><w:r><w:t>Q3 total:</w:t></w:r><w:r><w:t xml:space="preserve"> 5596.50 &amp; up</w:t></w:r></w:p><w:p><w:r><w:t>North leads</w:t></w:r></w:p></w:body></w:document>"#,
        )]);
        assert_eq!(
            extract_text("r.docx", &docx).unwrap(),
            "Q3 total: 5596.50 & up\nNorth leads"
        );
        let slide = |t: &str| {
            format!(
                r#"<p:sld xmlns:a="a" xmlns:p="p"><a:p><a:r><a:t>{t}</a:t></a:r></a:p></p:sld>"#
            )
        };
        let (s1, s2, s10) = (slide("Title"), slide("Numbers"), slide("End"));
        let pptx = zip_of(&[
            ("ppt/slides/slide10.xml", &s10),
            ("ppt/slides/slide2.xml", &s2),
            ("ppt/slides/slide1.xml", &s1),
            ("ppt/slides/_rels/slide1.xml.rels", "<x/>"),
        ]);
        assert_eq!(
            extract_text("deck.pptx", &pptx).unwrap(),
            "## Slide 1\nTitle\n\n## Slide 2\nNumbers\n\n## Slide 10\nEnd"
        );
        let e = extract_text("bad.docx", b"not a zip").unwrap_err();
        assert!(e.contains("bad.docx"), "{e}");
        assert!(extract_text("bad.pdf", b"%PDF-garbage").is_err());
    }

    #[test]
    fn xlsx_gives_each_sheet_as_tab_separated_rows() {
        let xlsx = zip_of(&[
            (
                "[Content_Types].xml",
                r#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/></Types>"#,
            ),
            (
                "xl/workbook.xml",
                r#"<?xml version="1.0"?><workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets><sheet name="Sales" sheetId="1" r:id="rId1"/></sheets></workbook>"#,
            ),
            (
                "xl/_rels/workbook.xml.rels",
                r#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/></Relationships>"#,
            ),
            (
                "xl/worksheets/sheet1.xml",
                r#"<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData><row r="1"><c r="A1" t="inlineStr"><is><t>region</t></is></c><c r="B1" t="inlineStr"><is><t>amount</t></is></c></row><row r="2"><c r="A2" t="inlineStr"><is><t>north</t></is></c><c r="B2"><v>10.5</v></c></row></sheetData></worksheet>"#,
            ),
        ]);
        assert_eq!(
            extract_text("sales.xlsx", &xlsx).unwrap(),
            "## Sheet Sales\nregion\tamount\nnorth\t10.5"
        );
    }

    #[test]
    fn html_loses_tags_scripts_and_entities() {
        let t = extract_text(
            "r.html",
            b"<html><head><style>p{}</style><script>var x=1;</script></head><body><h1>Total</h1><p>42 &amp; more</p></body></html>",
        )
        .unwrap();
        assert_eq!(t, "Total 42 & more");
    }

    #[test]
    fn file_checks_report_missing_size_and_hash() {
        let files = vec![ProducedFile {
            path: "a.json".into(),
            size: 10,
            sha256: "ab".into(),
            content: None,
        }];
        let exp = vec![
            ExpectedFile {
                path: "a.json".into(),
                min_size: Some(5),
                sha256: Some("AB".into()),
                ..Default::default()
            },
            ExpectedFile {
                path: "b.json".into(),
                ..Default::default()
            },
            ExpectedFile {
                path: "a.json".into(),
                max_size: Some(3),
                ..Default::default()
            },
        ];
        let r = check_files(&exp, &files);
        assert!(r[0].1, "{r:?}");
        assert_eq!((r[1].1, r[1].2.as_str()), (false, "missing"));
        assert!(!r[2].1);
    }
}
