/*
stop_signals.h — the signals that end a run: SIGTERM and SIGUSR1 (what SLURM sends before a
time limit), SIGINT (Ctrl-C), SIGHUP (a closed terminal). During training a save and an exit
after the current step; during start-up an exit at once, with nothing to save; a conversion
(convert.h) and generation stop on them too.

Interface (what train.c and convert.h use): stop_requested, request_stop, signal_name,
on_stop_signals, stop_during_startup. It sits on parallel.h's grid and checkpoint.h's --save
lock (let go at a signal during start-up).
*/
#pragma once
#include <signal.h>

// ----------------------------------------------------------------------------
// stop signals

// SIGTERM and SIGUSR1 (what SLURM sends before a time limit), SIGINT (Ctrl-C) and SIGHUP (a
// closed terminal) ask for a save and an exit after the current step; the same signal a
// second time ends the run at once (a user who presses Ctrl-C twice means it).
static volatile sig_atomic_t stop_requested = 0;   // the signal's number
static void request_stop(int sig) {
    stop_requested = sig;
    signal(sig, SIG_DFL);
}

static const char* signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

static void on_stop_signals(void (*handler)(int)) {
    int stop_signals[] = {SIGTERM, SIGUSR1, SIGINT, SIGHUP};
    for (int i = 0; i < 4; i++) signal(stop_signals[i], handler);
}

// The same signals during start-up (building the sample index can take minutes) end the run
// at once: nothing is trained, so nothing is lost. Rank 0 says so in one line, the --save lock
// is let go, and the status is 128 + the signal, as a shell reports a process a signal ended.
// (In a handler only async-signal-safe calls: write, unlink, close, _exit.)
static void stop_during_startup(int sig) {
    const char* name = signal_name(sig);
    const char* rest = " during start-up, before any training: nothing to save\n";
    if (grid.world_rank == 0 && (write(STDERR_FILENO, "stopped by ", 11) < 0 || write(STDERR_FILENO, name, strlen(name)) < 0 ||
                                 write(STDERR_FILENO, rest, strlen(rest)) < 0)) { /* nothing more to say */ }
    release_save_lock();
    _exit(128 + sig);
}
