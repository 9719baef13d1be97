// Serving until SIGINT/SIGTERM, then a graceful shutdown.
//
// Signals go through a self-pipe: the handler only write()s the signal number (async-signal
// safe, whichever thread the kernel picks), and the serving thread polls the pipe. SIGPIPE is
// ignored so that a client closing its socket mid-write is an error return, not a crash.
//
// Shutdown sequence: stop admitting (new requests get 503, /health 503) -> wait up to `grace`
// for the requests in flight to finish -> cancel those still running (a second signal skips
// the wait) -> stop the engine -> stop the HTTP server. Exit code 0.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "server/http_server.h"

namespace kestrel::server {

// Installs the SIGINT/SIGTERM handlers (once per process) and ignores SIGPIPE.
Status InstallShutdownSignals();
// Waits up to `timeout` for SIGINT or SIGTERM: the signal number, or 0.
int WaitShutdownSignal(std::chrono::milliseconds timeout);

struct ShutdownOptions {
  std::chrono::seconds grace{10};       // running requests may finish within this
  std::chrono::seconds cancel_wait{5};  // after cancelling, how long to wait for their answers
};

// Runs `server` (bound already) until a signal, then shuts down as above. `log` receives one
// line per stage. Returns the process exit code: 0 after a signal, 1 if the server failed.
int ServeUntilShutdown(HttpServer& server, Engine& engine, const ShutdownOptions& options,
                       const std::function<void(const std::string&)>& log);

}  // namespace kestrel::server
