// `kestrel serve` on models/kestrel-tiny as a child process on a free port (the server tests'
// launcher): started with extra flags, its stderr collected, signalled, killed when the object
// goes.
#pragma once

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <regex>
#include <string>
#include <vector>

namespace kestrel::testing {

class ServeProcess {
 public:
  bool Start(const std::vector<std::string>& extra_args) {
    int err_pipe[2];
    if (pipe(err_pipe) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(err_pipe[1], 2);
      close(err_pipe[0]);
      close(err_pipe[1]);
      std::vector<std::string> args = {
          KESTREL_BINARY, "serve",
          "--model",      std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny",
          "--port",       "0",
          "--kv-memory",  "0.05",
          "--threads",    "2"};
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(err_pipe[1]);
    err_fd_ = err_pipe[0];
    // "kestrel: serving <id> at http://127.0.0.1:<port>/v1"
    const std::regex ready(R"(serving \S+ at http://127\.0\.0\.1:(\d+)/v1)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      ReadStderr(100);
      std::smatch m;
      if (std::regex_search(stderr_, m, ready)) {
        port_ = std::stoi(m[1]);
        return true;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
    }
    return false;
  }

  // Reads what the server wrote to stderr within timeout_ms.
  void ReadStderr(int timeout_ms) {
    pollfd fd{err_fd_, POLLIN, 0};
    if (poll(&fd, 1, timeout_ms) <= 0) return;
    char buf[4096];
    const ssize_t n = read(err_fd_, buf, sizeof(buf));
    if (n > 0) stderr_.append(buf, static_cast<size_t>(n));
  }

  void Signal(int signo) {
    if (pid_ > 0) kill(pid_, signo);
  }

  // The exit code, or -1 if the process did not exit within the timeout.
  int WaitExit(std::chrono::seconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      ReadStderr(50);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    return -1;
  }

  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (err_fd_ >= 0) close(err_fd_);
  }

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& stderr_text() const { return stderr_; }

 private:
  pid_t pid_ = -1;
  int err_fd_ = -1;
  int port_ = 0;
  std::string stderr_;
};

}  // namespace kestrel::testing
