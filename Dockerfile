# kvsieve serve in a container, built from Debian 12 packages with the
# project's own scripts (scripts/deps.sh --build, make install).
#
#   docker build -t kvsieve .
#   docker run --rm -p 8080:8080 kvsieve                     # the bundled model
#   docker run --rm -p 8080:8080 -v $PWD/models:/models kvsieve -m /models/MY.gguf
#
# Then open http://127.0.0.1:8080/ (the chat page) or use the API.  Flags
# after the image name replace the default CMD (the bundled model); add
# --api-key KEY (or -e KVSIEVE_API_KEY=KEY) before exposing it beyond the host.

FROM debian:12 AS build
WORKDIR /src
COPY scripts/deps.sh scripts/deps.sh
RUN bash scripts/deps.sh --build && rm -rf /var/lib/apt/lists/*
COPY . .
# only the binary and the libraries make install takes (not the tests)
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release > /dev/null \
 && cmake --build /build -j "$(nproc)" --target kvsieve_cli \
 && cmake --install /build --prefix /opt/kvsieve

FROM debian:12-slim
# the shared libraries the binary links (libpcre2-8, libcjson, libmicrohttpd)
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libpcre2-8-0 libcjson1 libmicrohttpd12 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/kvsieve /usr/local
COPY models/kvsieve-default.gguf /models/kvsieve-default.gguf
# its draft model, for requests that ask for the spec policy
COPY models/kvsieve-default-dlm /models/kvsieve-default-dlm
RUN useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin kvsieve
USER kvsieve
EXPOSE 8080
# inside the container the server must listen beyond loopback for -p to reach it
ENTRYPOINT ["kvsieve", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD ["-m", "/models/kvsieve-default.gguf"]
