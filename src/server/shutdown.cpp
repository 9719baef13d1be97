#include "server/shutdown.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

namespace kestrel::server {
namespace {

int g_signal_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int signo) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  // A full pipe (many signals unread) drops the byte: one pending signal is enough.
  const ssize_t written = write(g_signal_pipe[1], &byte, 1);
  (void)written;
  errno = saved_errno;
}

const char* SignalName(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

using Clock = std::chrono::steady_clock;

// Waits until no request is in flight, `deadline` passes, or (if `stop_on_signal`) another
// signal arrives. True when nothing is left in flight.
bool WaitIdle(const HttpServer& server, Clock::time_point deadline, bool stop_on_signal) {
  while (server.active_requests() > 0 && Clock::now() < deadline) {
    if (WaitShutdownSignal(std::chrono::milliseconds(100)) != 0 && stop_on_signal) break;
  }
  return server.active_requests() == 0;
}

}  // namespace

Status InstallShutdownSignals() {
  std::signal(SIGPIPE, SIG_IGN);
  if (g_signal_pipe[0] >= 0) return Status::Ok();
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return IoError(std::string("cannot create the signal pipe: ") + std::strerror(errno));
  }
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : {SIGINT, SIGTERM}) {
    if (sigaction(signo, &action, nullptr) != 0) {
      return IoError(std::string("cannot install the signal handler: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

int WaitShutdownSignal(std::chrono::milliseconds timeout) {
  if (g_signal_pipe[0] < 0) {
    std::this_thread::sleep_for(timeout);
    return 0;
  }
  pollfd fd{g_signal_pipe[0], POLLIN, 0};
  const int ready = poll(&fd, 1, static_cast<int>(timeout.count()));
  if (ready <= 0) return 0;
  unsigned char byte = 0;
  return read(g_signal_pipe[0], &byte, 1) == 1 ? byte : 0;
}

int ServeUntilShutdown(HttpServer& server, Engine& engine, const ShutdownOptions& options,
                       const std::function<void(const std::string&)>& log) {
  std::thread listener([&server] { server.Run(); });
  int signo = 0;
  while (server.running() && signo == 0) {
    signo = WaitShutdownSignal(std::chrono::milliseconds(200));
  }
  int exit_code = 0;
  if (signo == 0) {
    log("kestrel: error: the HTTP server stopped accepting connections");
    exit_code = 1;
  } else {
    server.BeginDrain();
    const size_t n_active = server.active_requests();
    log(std::string("kestrel: ") + SignalName(signo) + ": shutting down; new requests get 503" +
        (n_active > 0
             ? ", waiting up to " + std::to_string(options.grace.count()) + " s for " +
                   std::to_string(n_active) + " running request(s) (signal again to cancel them)"
             : ""));
    if (!WaitIdle(server, Clock::now() + options.grace, /*stop_on_signal=*/true)) {
      log("kestrel: cancelling " + std::to_string(server.active_requests()) +
          " unfinished request(s)");
      server.CancelActive();
      WaitIdle(server, Clock::now() + options.cancel_wait, /*stop_on_signal=*/false);
    }
  }
  engine.Shutdown(/*cancel_running=*/true);
  // stop() only acts on a running accept loop: repeat until Run has returned, in case the
  // listener thread had not entered it yet.
  server.Stop();
  while (server.running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    server.Stop();
  }
  listener.join();
  if (exit_code == 0) log("kestrel: stopped");
  return exit_code;
}

}  // namespace kestrel::server
