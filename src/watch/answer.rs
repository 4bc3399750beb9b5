//! What an endpoint answers: a status, a content type and a body (`http.rs` writes it).

/// An answer: status, content type, body.
pub struct Answer {
    pub status: u16,
    pub kind: &'static str,
    pub body: String,
}

impl Answer {
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer {
            status,
            kind: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}
