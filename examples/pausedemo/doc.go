// Package pausedemo is the pause demo: a worker holding a lock is frozen
// with SIGSTOP past its lease, another worker takes the lock over and
// writes, and when the first one wakes up its late write is refused by the
// storage service, which checks fencing tokens. The programs are in
// storage/ and worker/; pausedemo_test.go runs the whole story with real
// processes and a real coordinatord.
package pausedemo
