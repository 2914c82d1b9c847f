//! The web inspector at `/admin/`: a static page (HTML, one script with the
//! ES modules it imports, one style sheet, no build step, nothing from a CDN)
//! with which operators find, explain and repair stuck sagas and inspect and
//! replay dead letters.
//!
//! The files live in `services/gateway/assets/admin/` and are compiled into
//! the binary. The page itself is public; every data call it makes carries
//! the operator's bearer token (asked for in the page, kept in
//! `sessionStorage`, or handed over as `#token=<jwt>` in the URL fragment)
//! and goes to the guarded `/v1/admin/...` routes. These routes are not in
//! the OpenAPI document: they are not part of the API.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX_HTML: &str = include_str!("../../assets/admin/index.html");
const APP_JS: &str = include_str!("../../assets/admin/app.js");
const APP_CSS: &str = include_str!("../../assets/admin/app.css");
/// The modules `app.js` imports (`assets/admin/js/`), each at its path.
const MODULES: &[(&str, &str)] = &[
    ("/admin/js/api.js", include_str!("../../assets/admin/js/api.js")),
    ("/admin/js/confirm.js", include_str!("../../assets/admin/js/confirm.js")),
    ("/admin/js/dlq-message.js", include_str!("../../assets/admin/js/dlq-message.js")),
    ("/admin/js/dlq.js", include_str!("../../assets/admin/js/dlq.js")),
    ("/admin/js/dom.js", include_str!("../../assets/admin/js/dom.js")),
    ("/admin/js/format.js", include_str!("../../assets/admin/js/format.js")),
    ("/admin/js/lists.js", include_str!("../../assets/admin/js/lists.js")),
    ("/admin/js/login.js", include_str!("../../assets/admin/js/login.js")),
    ("/admin/js/messages.js", include_str!("../../assets/admin/js/messages.js")),
    ("/admin/js/refresh.js", include_str!("../../assets/admin/js/refresh.js")),
    ("/admin/js/saga-actions.js", include_str!("../../assets/admin/js/saga-actions.js")),
    ("/admin/js/saga.js", include_str!("../../assets/admin/js/saga.js")),
    ("/admin/js/sagas.js", include_str!("../../assets/admin/js/sagas.js")),
    ("/admin/js/state.js", include_str!("../../assets/admin/js/state.js")),
    ("/admin/js/timeline.js", include_str!("../../assets/admin/js/timeline.js")),
    ("/admin/js/views.js", include_str!("../../assets/admin/js/views.js")),
];
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// Only the page's own files; no inline script or style, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; connect-src 'self'; img-src 'self' data:; \
     style-src 'self'; script-src 'self'; frame-ancestors 'none'";

/// `GET /admin` (redirected to `/admin/`), `/admin/`, `/admin/app.js`, the
/// modules under `/admin/js/` and `/admin/app.css`. Stateless, so it merges
/// into any router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let router = Router::new()
        // Relative, so it also holds behind a proxy that adds a path prefix.
        .route("/admin", get(|| async { Redirect::permanent("admin/") }))
        .route("/admin/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/admin/app.js", get(|| async { asset(JAVASCRIPT, APP_JS) }))
        .route("/admin/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }));
    MODULES.iter().fold(router, |router, &(path, body)| {
        router.route(path, get(move || async move { asset(JAVASCRIPT, body) }))
    })
}

/// One embedded file with its type; always revalidated (a new gateway
/// version serves new files), never sniffed, never framed.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    (headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    async fn get(path: &str) -> Response {
        let request = Request::get(path).body(Body::empty()).unwrap();
        routes::<()>().oneshot(request).await.unwrap()
    }

    async fn text(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn serves_each_file_with_its_type_and_strict_headers() {
        let mut files = vec![
            ("/admin/", "text/html; charset=utf-8", INDEX_HTML),
            ("/admin/app.js", "text/javascript; charset=utf-8", APP_JS),
            ("/admin/app.css", "text/css; charset=utf-8", APP_CSS),
        ];
        files.extend(MODULES.iter().map(|&(path, body)| (path, "text/javascript; charset=utf-8", body)));
        for (path, content_type, body) in files {
            let response = get(path).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let h = response.headers();
            assert_eq!(h[header::CONTENT_TYPE], content_type, "{path}");
            assert_eq!(h[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY, "{path}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            assert_eq!(text(response).await, body, "{path}");
        }
    }

    #[tokio::test]
    async fn admin_without_a_slash_redirects_to_the_page() {
        let response = get("/admin").await;
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.headers()[header::LOCATION], "admin/");
    }

    /// What the content security policy would block, or what would load
    /// from elsewhere, is not in the files.
    #[test]
    fn the_files_need_nothing_the_policy_forbids() {
        let mut files = vec![("index.html", INDEX_HTML), ("app.js", APP_JS), ("app.css", APP_CSS)];
        files.extend(MODULES.iter().copied());
        for (name, file) in files {
            // The SVG namespace is a name, not an address that is loaded.
            let file = file.replace("'http://www.w3.org/2000/svg'", "");
            for external in ["http://", "https://", "//cdn", "@import", "url(http", "url(//"] {
                assert!(!file.contains(external), "{name} refers to {external}");
            }
        }
        let html = INDEX_HTML.to_ascii_lowercase();
        assert!(!html.contains(" style="), "no inline style attributes");
        assert!(!html.contains("<style"), "no inline style sheets");
        let handlers = html.split(" on").skip(1).filter(|rest| {
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with('=')
        });
        assert_eq!(handlers.count(), 0, "no inline event handlers");
        assert_eq!(html.matches("<script").count(), 1);
        assert!(html.contains(r#"<script type="module" src="app.js"></script>"#));
        // Data only ever goes into the DOM as text.
        let scripts = std::iter::once(("app.js", APP_JS)).chain(MODULES.iter().copied());
        for (name, script) in scripts {
            for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
                assert!(!script.contains(sink), "{name} uses {sink}");
            }
        }
    }

    /// Every module a script imports (`from './…'`, relative to the script)
    /// is served, and every module served is imported.
    #[test]
    fn the_modules_imported_are_the_modules_served() {
        let scripts = std::iter::once(("/admin/app.js", APP_JS)).chain(MODULES.iter().copied());
        let mut imported = std::collections::BTreeSet::new();
        for (path, script) in scripts {
            let dir = &path[..=path.rfind('/').unwrap()];
            assert!(!script.contains("import("), "{path} imports a module dynamically");
            for rest in script.split("from '").skip(1) {
                let specifier = &rest[..rest.find('\'').unwrap()];
                let file =
                    specifier.strip_prefix("./").unwrap_or_else(|| panic!("{path} imports {specifier}"));
                assert!(!file.contains("..") && file.ends_with(".js"), "{path} imports {specifier}");
                let module = format!("{dir}{file}");
                assert!(
                    MODULES.iter().any(|(served, _)| *served == module),
                    "{path} imports {module}, not served"
                );
                imported.insert(module);
            }
        }
        for (served, _) in MODULES {
            assert!(imported.contains(*served), "{served} is served but imported by no script");
        }
    }
}
