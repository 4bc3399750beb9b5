/* Interleaved timer for scripts/bench-*.sh: each round runs every command once, in a random
 * order, timing fork+exec+wait on CLOCK_MONOTONIC (like hyperfine -N, but interleaved, so the
 * machine's drift hits every command alike). Prints per command: median, p10, p90 in ms.
 * Usage: interleave ROUNDS CMDFILE   (one command per line, words split on spaces, or on tabs
 * only when the line has a tab, so a word can hold spaces; no shell)
 * A word's "{n}" becomes PID-ROUND, unique to the round and the run (a fresh KEY per round).
 * Leading NAME=value words go into the command's environment (as env(1) would, without its exec). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/wait.h>

#define MAXC 16
#define MAXW 64

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: interleave ROUNDS CMDFILE\n"); return 2; }
    int rounds = atoi(argv[1]);
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 2; }
    char *lines[MAXC], *words[MAXC][MAXW];
    int n = 0;
    char buf[4096];
    while (n < MAXC && fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        if (!*buf) continue;
        lines[n] = strdup(buf);
        char *copy = strdup(buf), *save = NULL;
        int w = 0;
        const char *sep = strchr(copy, '\t') ? "\t" : " ";
        for (char *tok = strtok_r(copy, sep, &save); tok && w < MAXW - 1; tok = strtok_r(NULL, sep, &save))
            words[n][w++] = tok;
        words[n][w] = NULL;
        n++;
    }
    double *t[MAXC];
    int failed[MAXC] = {0};
    for (int c = 0; c < n; c++) t[c] = calloc(rounds, sizeof(double));
    srand((unsigned)time(NULL) ^ getpid());
    int devnull = open("/dev/null", O_WRONLY);
    for (int r = 0; r < rounds; r++) {
        int order[MAXC];
        for (int c = 0; c < n; c++) order[c] = c;
        for (int c = n - 1; c > 0; c--) { int j = rand() % (c + 1), x = order[c]; order[c] = order[j]; order[j] = x; }
        for (int k = 0; k < n; k++) {
            int c = order[k];
            char *argv_r[MAXW], held[MAXW][512];
            for (int w = 0; w < MAXW; w++) {
                argv_r[w] = words[c][w];
                if (!words[c][w]) break;
                char *at = strstr(words[c][w], "{n}");
                if (at) {
                    snprintf(held[w], sizeof held[w], "%.*s%d-%d%s", (int)(at - words[c][w]),
                             words[c][w], (int)getpid(), r, at + 3);
                    argv_r[w] = held[w];
                }
            }
            double t0 = now_ms();
            pid_t p = fork();
            if (p == 0) {
                dup2(devnull, 1);
                char **cmd = argv_r;
                while (*cmd && strchr(*cmd, '=') && **cmd != '=') putenv(*cmd++);
                execvp(cmd[0], cmd);
                _exit(127);
            }
            int st;
            waitpid(p, &st, 0);
            t[c][r] = now_ms() - t0;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed[c]++;
        }
    }
    for (int c = 0; c < n; c++) {
        qsort(t[c], rounds, sizeof(double), cmp);
        printf("%.3f %.3f %.3f %d %s\n", t[c][rounds / 2], t[c][rounds / 10], t[c][rounds * 9 / 10], failed[c], lines[c]);
    }
    return 0;
}
