//! What an endpoint answers: a status, a content type and a body (`http.rs` writes it).

/// An answer: status, content type, body.
pub struct Response {
    pub status: u16,
    pub kind: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            kind: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}
