// SPDX-License-Identifier: Apache-2.0
// test-child.h: running part of a test in a child process, for what must not touch the test
// itself: a call that may end the process (an exit inside OpenMP, a signal), limits set with
// setrlimit, and peak memory measured on its own (getrusage's maxrss of the child).
#pragma once

#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

// Runs fn in a child process (killed by SIGALRM after alarm_s seconds); returns its exit status,
// or 128 + the signal that ended it. fn reports by calling _exit(status); returning is status 0.
static inline int test_in_child(void (*fn)(void), unsigned alarm_s) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(alarm_s);
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The growth of the peak RSS (bytes) while fn runs in a child process, or -1 when the child did not
// return normally (then *status, if not NULL, says how it ended: its exit status or 128 + signal).
static inline long long test_rss_growth(void (*fn)(void), int * status) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        alarm(120);
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        fn();
        getrusage(RUSAGE_SELF, &r1);
        const long long growth = (long long)(r1.ru_maxrss - r0.ru_maxrss) * 1024;
        if (write(fds[1], &growth, sizeof growth) != sizeof growth) _exit(2);
        _exit(0);
    }
    close(fds[1]);
    long long growth = -1;
    if (read(fds[0], &growth, sizeof growth) != sizeof growth) growth = -1;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (status) *status = code;
    if (code) fprintf(stderr, "  the measured child ended with status %d\n", code);
    return code ? -1 : growth;
}
