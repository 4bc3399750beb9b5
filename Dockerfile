# A minimal image holding only the static cronlock binary, to copy into your own images:
#
#   docker build -t cronlock .
#   # in your Dockerfile:
#   COPY --from=cronlock /cronlock /usr/local/bin/cronlock
#
# The binary needs nothing from the image it lands in: no libc, no CA store (for rediss:// it
# uses the system's CAs when there are any, else its bundled Mozilla roots, or --tls-ca-cert).
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY src src
RUN cargo build --release --locked \
 && cp target/x86_64-unknown-linux-gnu/release/cronlock /cronlock \
 && /cronlock --version

FROM scratch
COPY --from=build /cronlock /cronlock
ENTRYPOINT ["/cronlock"]
