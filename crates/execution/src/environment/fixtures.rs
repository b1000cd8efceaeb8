//! Package indexes on loopback for tests and benchmarks (`test-util`), serving what the caller
//! builds: a PEP 503 "simple" index of wheels, and an npm registry (a packument per name, its
//! tarball). Each keeps a log of the paths it was asked for.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Fixtures: a failed setup should fail the test.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// A wheel of a pure-Python distribution `name` at `version` whose module `name` holds
/// `module` as its `__init__.py`.
pub fn wheel(name: &str, version: &str, module: &str) -> (String, Vec<u8>) {
    let file = format!("{name}-{version}-py3-none-any.whl");
    let dist_info = format!("{name}-{version}.dist-info");
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default();
        let files = [
            (format!("{name}/__init__.py"), module.to_string()),
            (
                format!("{dist_info}/METADATA"),
                format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"),
            ),
            (
                format!("{dist_info}/WHEEL"),
                "Wheel-Version: 1.0\nGenerator: skilleval-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_string(),
            ),
        ];
        let mut record = String::new();
        for (path, content) in &files {
            zip.start_file(path.as_str(), opts).unwrap();
            zip.write_all(content.as_bytes()).unwrap();
            record.push_str(&format!("{path},,\n"));
        }
        record.push_str(&format!("{dist_info}/RECORD,,\n"));
        zip.start_file(format!("{dist_info}/RECORD"), opts).unwrap();
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
    }
    (file, buf.into_inner())
}

/// An npm tarball: `package/package.json` and `package/index.js` (ustar, gzipped).
pub fn npm_tarball(name: &str, version: &str, index_js: &str) -> Vec<u8> {
    let manifest = format!(r#"{{"name": "{name}", "version": "{version}", "main": "index.js"}}"#);
    let mut tar = Vec::new();
    for (path, content) in [
        ("package/package.json", manifest.as_str()),
        ("package/index.js", index_js),
    ] {
        tar.extend(ustar_header(path, content.len()));
        tar.extend(content.as_bytes());
        tar.resize(tar.len().div_ceil(512) * 512, 0);
    }
    tar.resize(tar.len() + 1024, 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

/// A ustar header for a regular file (no tar crate in the workspace; the format is small).
fn ustar_header(path: &str, size: usize) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..path.len()].copy_from_slice(path.as_bytes());
    let octal = |field: &mut [u8], value: usize| {
        let text = format!("{:0width$o}\0", value, width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    };
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: usize = h.iter().map(|b| usize::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    h
}

/// What a server holds and was asked.
#[derive(Default)]
pub struct Shelf {
    /// Python: normalised project name -> (wheel file name, bytes, where its link points:
    /// `None` for this server).
    pub wheels: BTreeMap<String, (String, Vec<u8>, Option<String>)>,
    /// npm: name -> (version, tarball).
    pub tarballs: BTreeMap<String, (String, Vec<u8>)>,
    pub log: Vec<String>,
}

/// A running index; its shelf may be changed while it runs.
pub struct Index {
    pub addr: SocketAddr,
    pub shelf: Arc<Mutex<Shelf>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Index {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Index {
    /// The PEP 503 index URL.
    pub fn simple_url(&self) -> String {
        format!("http://{}/simple/", self.addr)
    }

    pub fn registry_url(&self) -> String {
        format!("http://{}/npm/", self.addr)
    }

    /// The paths asked for so far.
    pub fn log(&self) -> Vec<String> {
        self.shelf.lock().unwrap().log.clone()
    }

    pub fn add_wheel(&self, name: &str, version: &str, module: &str) {
        let (file, bytes) = wheel(name, version, module);
        self.shelf
            .lock()
            .unwrap()
            .wheels
            .insert(name.to_string(), (file, bytes, None));
    }

    pub fn add_tarball(&self, name: &str, version: &str, index_js: &str) {
        self.shelf.lock().unwrap().tarballs.insert(
            name.to_string(),
            (version.to_string(), npm_tarball(name, version, index_js)),
        );
    }
}

/// Serves an index on a fresh loopback port.
pub async fn serve() -> Index {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener).await
}

/// Serves an index on this listener.
pub async fn serve_on(listener: tokio::net::TcpListener) -> Index {
    let addr = listener.local_addr().unwrap();
    let shelf = Arc::new(Mutex::new(Shelf::default()));
    let app = Router::new()
        .route("/simple/{project}/", get(project_page))
        .route("/files/{file}", get(wheel_file))
        .route("/npm/{name}", get(packument))
        .route("/npm/-/{file}", get(tarball))
        .fallback(|req: axum::extract::Request| async move {
            (StatusCode::NOT_FOUND, format!("no {}", req.uri()))
        })
        .with_state(Ctx {
            shelf: shelf.clone(),
            base: format!("http://{addr}"),
        });
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Index { addr, shelf, task }
}

#[derive(Clone)]
struct Ctx {
    shelf: Arc<Mutex<Shelf>>,
    base: String,
}

async fn project_page(State(ctx): State<Ctx>, Path(project): Path<String>) -> Response {
    let mut shelf = ctx.shelf.lock().unwrap();
    shelf.log.push(format!("/simple/{project}/"));
    match shelf.wheels.get(&project) {
        Some((file, _, elsewhere)) => {
            let base = elsewhere.clone().unwrap_or_else(|| ctx.base.clone());
            let html = format!(
                "<!DOCTYPE html><html><body><a href=\"{base}/files/{file}\">{file}</a></body></html>"
            );
            ([("content-type", "text/html")], html).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such project").into_response(),
    }
}

async fn wheel_file(State(ctx): State<Ctx>, Path(file): Path<String>) -> Response {
    let mut shelf = ctx.shelf.lock().unwrap();
    shelf.log.push(format!("/files/{file}"));
    match shelf.wheels.values().find(|(f, _, _)| *f == file) {
        Some((_, bytes, _)) => bytes.clone().into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

async fn packument(State(ctx): State<Ctx>, Path(name): Path<String>) -> Response {
    let mut shelf = ctx.shelf.lock().unwrap();
    shelf.log.push(format!("/npm/{name}"));
    match shelf.tarballs.get(&name) {
        Some((version, _)) => {
            let tarball = format!("{}/npm/-/{name}-{version}.tgz", ctx.base);
            axum::Json(serde_json::json!({
                "name": name,
                "dist-tags": {"latest": version},
                "versions": {version.clone(): {
                    "name": name, "version": version,
                    "dist": {"tarball": tarball}
                }}
            }))
            .into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": "Not found"})),
        )
            .into_response(),
    }
}

async fn tarball(State(ctx): State<Ctx>, Path(file): Path<String>) -> Response {
    let mut shelf = ctx.shelf.lock().unwrap();
    shelf.log.push(format!("/npm/-/{file}"));
    let found = shelf
        .tarballs
        .iter()
        .find(|(name, (version, _))| file == format!("{name}-{version}.tgz"))
        .map(|(_, (_, bytes))| bytes.clone());
    match found {
        Some(bytes) => bytes.into_response(),
        None => (StatusCode::NOT_FOUND, "no such tarball").into_response(),
    }
}
