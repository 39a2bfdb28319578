package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRemovedMemberStops: the leader of three allocator processes,
// removed through the admin API, answers the removal, steps down, logs
// once that it was removed and exits with status 3 and errRemoved's
// message, while the two others serve on. Started again on its data, it
// holds a configuration without itself and hears from no leader, so it
// exits the same way. Every member logs "ready" only once it knows a
// leader.
func TestRemovedMemberStops(t *testing.T) {
	c := startCluster(t, 3)
	first := c.procs[0].cmd.Args[3:] // after the binary and startBinary's -listen
	tokens := first[slices.Index(first, "-admin-token-file")+1]
	leader, _ := leaderOf(t, tokens, c.urls...)
	gone := slices.Index(c.urls, leader)
	args := c.procs[gone].cmd.Args[3:] // to start the removed member again
	// A leadership change on a loaded machine may answer 503 (the outcome
	// unknown): try again; then 404 says the first attempt was applied.
	for attempt := 1; ; attempt++ {
		out, err := op(t, tokens, "cluster", "remove", "-addr", leader, "-id", fmt.Sprintf("m%d", gone))
		if err == nil && out == fmt.Sprintf("removed m%d\n", gone) || attempt > 1 && err != nil && strings.Contains(err.Error(), "404") {
			break
		}
		if attempt == 3 || err == nil || !strings.Contains(err.Error(), "503") {
			t.Fatalf("remove: %q %v", out, err)
		}
	}
	exitedRemoved := func(p *process) {
		t.Helper()
		select {
		case err := <-p.done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitRemoved {
				t.Fatalf("the removed member exited with %v, want status %d\n%s", err, exitRemoved, p.logs.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the removed member still runs 20 s after its removal:\n%s", p.logs.String())
		}
		logs := p.logs.String()
		if n := strings.Count(logs, "allocator: this member was removed from the cluster; stopping"); n != 1 || !strings.Contains(logs, errRemoved.Error()) {
			t.Fatalf("the removal logged %d times, or without its message on stderr:\n%s", n, logs)
		}
	}
	exitedRemoved(c.procs[gone])

	var others []string
	for i, u := range c.urls {
		if i != gone {
			others = append(others, u)
			waitReady(t, u, http.DefaultClient)
		}
	}
	if out, err := op(t, tokens, "cluster", "members", "-addr", others[0]); err != nil || strings.Count(out, "\tvoter") != 2 {
		t.Fatalf("members after the removal: %q %v", out, err)
	}

	for i, p := range c.procs {
		if i == gone {
			continue
		}
		// /readyz answers from the node at once; the log line comes from
		// the watcher's next look (every watchInterval).
		var ready struct{ Leader string }
		for deadline := time.Now().Add(5 * time.Second); ready.Leader == ""; time.Sleep(20 * time.Millisecond) {
			for line := range strings.Lines(p.logs.String()) {
				if strings.Contains(line, `"msg":"allocator: ready"`) {
					if err := json.Unmarshal([]byte(line), &ready); err != nil || ready.Leader == "" {
						t.Fatalf("member %d logged ready without a leader: %s", i, line)
					}
					break
				}
			}
			if ready.Leader == "" && time.Now().After(deadline) {
				t.Fatalf("member %d never logged ready:\n%s", i, p.logs.String())
			}
		}
	}

	exitedRemoved(startBinary(t, args...))
}
