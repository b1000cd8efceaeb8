//! The web interface: server-rendered pages under `/ui/` (and `/` redirecting there).
//!
//! Pages are HTML rendered with `maud` (every interpolated value escaped), the run page's
//! pieces shared with `skilleval run --format html` through `skilleval_reports::html`. A
//! little vanilla JavaScript (upload with validation, live run progress, the skill page's
//! quality chart) is served from `/ui/static/`, compiled into the binary with the stylesheet:
//! nothing is loaded from another origin. Every page carries a Content-Security-Policy that
//! allows scripts and styles from this server only (no inline script), so markup smuggled
//! into a skill's output could not run even if it escaped the templates.
//!
//! Authentication is the API's ([`crate::auth`]): the sign-in form sets the session cookie.

use axum::body::Body;
use axum::extract::{Form, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;

use crate::auth::{identify, SESSION_COOKIE};
use crate::error::ApiError;
use crate::state::AppState;

pub mod charts;
mod collisions;
pub mod pages;

/// What every `/ui/` response is allowed to load and run.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// The `/ui/` routes and `/`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(pages::skills))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/static/{file}", get(asset))
        .route("/ui/upload", get(pages::upload))
        .route("/ui/skills/{name}", get(pages::skill))
        .route("/ui/skills/{name}/preview", get(pages::preview))
        .route(
            "/ui/skills/{name}/versions/{version}/edit",
            get(pages::editor),
        )
        .route("/ui/runs/{id}", get(pages::run))
        .route("/ui/runs/{id}/cases/{index}", get(pages::case))
        .route("/ui/runs/{id}/cases/{index}/review", post(pages::review))
        .route("/ui/comparisons/{id}", get(pages::comparison))
        .route("/ui/matrix/{id}", get(pages::matrix))
        .route("/ui/compare", post(pages::compare))
        .layer(middleware::from_fn(security_headers))
}

async fn security_headers(request: axum::extract::Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Static files, compiled in.
async fn asset(Path(file): Path<String>) -> Response {
    let (body, content_type): (&'static str, &'static str) = match file.as_str() {
        "style.css" => (skilleval_reports::html::STYLE, "text/css; charset=utf-8"),
        "upload.js" => (
            include_str!("assets/upload.js"),
            "text/javascript; charset=utf-8",
        ),
        "progress.js" => (
            include_str!("assets/progress.js"),
            "text/javascript; charset=utf-8",
        ),
        "skill.js" => (
            include_str!("assets/skill.js"),
            "text/javascript; charset=utf-8",
        ),
        "preview.js" => (
            include_str!("assets/preview.js"),
            "text/javascript; charset=utf-8",
        ),
        "editor.js" => (
            include_str!("assets/editor.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// A page in the common layout.
pub fn layout(title: &str, body: Markup) -> Html<String> {
    layout_with_scripts(title, body, &[])
}

/// A page in the common layout with scripts from `/ui/static/`.
pub fn layout_with_scripts(title: &str, body: Markup, scripts: &[&str]) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · skilleval" }
                    link rel="icon" href="data:,";
                    link rel="stylesheet" href="/ui/static/style.css";
                }
                body {
                    header {
                        h1 { a href="/ui/" { "skilleval" } }
                        nav { a href="/ui/" { "Skills" } a href="/ui/upload" { "Upload" } }
                        form method="post" action="/ui/logout" { button type="submit" { "Sign out" } }
                    }
                    main { h2 { (title) } (PreEscaped(body.into_string())) }
                    @for s in scripts { script src=(format!("/ui/static/{s}")) {} }
                }
            }
        }
        .into_string(),
    )
}

/// An error shown as a page (the API's error, same status; a 5xx says nothing of its cause,
/// which is logged by the error middleware).
#[derive(Debug)]
pub struct PageError(pub ApiError);

impl<E: Into<ApiError>> From<E> for PageError {
    fn from(e: E) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        let message = if status.is_server_error() {
            "Something went wrong on the server; the cause is in its log.".to_string()
        } else {
            self.0.message.clone()
        };
        let page = layout(
            &format!("Error {}", status.as_u16()),
            html! { p.error #error-message { (message) } },
        );
        let (mut parts, _) = self.0.into_response().into_parts();
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, Body::from(page.0))
    }
}

async fn login_form() -> Html<String> {
    login_page(None)
}

fn login_page(error: Option<&str>) -> Html<String> {
    layout(
        "Sign in",
        html! {
            @if let Some(e) = error { p.error #login-error { (e) } }
            form method="post" action="/ui/login" #login {
                label { "API token " input type="password" name="token" autocomplete="current-password" required; }
                " " button type="submit" { "Sign in" }
            }
        },
    )
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(state): State<AppState>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    // The same check as every API request: a static token or a stored, unrevoked one.
    if identify(&state.access.auth, &state.store, Some(token))
        .await
        .is_err()
    {
        return (
            StatusCode::UNAUTHORIZED,
            login_page(Some("That token is not accepted.")),
        )
            .into_response();
    }
    session_cookie("/ui/", &hex::encode(token.as_bytes()), "")
}

async fn logout() -> Response {
    session_cookie("/ui/login", "", "; Max-Age=0")
}

/// A redirect to `to` that sets the session cookie to `value` (`extra`: more attributes).
fn session_cookie(to: &str, value: &str, extra: &str) -> Response {
    let mut response = Redirect::to(to).into_response();
    let cookie = format!("{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict{extra}");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
