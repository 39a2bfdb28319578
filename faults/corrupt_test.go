//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// TestCorruptStoresAreRefused damages the stores of a stopped allocator
// (its journal, allocator.db) and of a stopped cluster member (its raft
// log, raft.db) the ways disks and operators do: emptied, cut to a page,
// bytes flipped in every data page, and for the member the raft log
// deleted beside the state it left. Started on each, the process exits
// with status 1 and a message naming the file and the reason, never a
// panic; started on the sound files again, it serves.
func TestCorruptStoresAreRefused(t *testing.T) {
	ctx := deadline(t, 90*time.Second)
	dir := t.TempDir()

	alone := startAllocator(ctx, t, time.Second, "")
	writeKeysOf(ctx, t, alone.url(), alone.tokenFile)
	stop(ctx, t, alone)
	refusals(ctx, t, alone, "allocator.db", map[string]string{
		"emptied": "is damaged", "cut to a page": "is damaged", "pages flipped": "is damaged"})

	ports := []string{freePort(t), freePort(t)}
	member := &allocatorProc{name: "member", addr: ports[0], dataDir: filepath.Join(dir, "member"), tokenFile: writeToken(t, dir),
		ttl: time.Second, extra: []string{"-cluster-id", "solo", "-cluster-peers", fmt.Sprintf("solo=%s=http://%s", ports[1], ports[0]),
			"-cluster-bootstrap", "-cluster-election-timeout", "100ms",
			"-admin-token-file", writeSecret(t, dir, "admin", adminToken), "-peer-token-file", writeSecret(t, dir, "peer", peerToken)}}
	member.restart(ctx, t)
	writeKeysOf(ctx, t, member.url(), member.tokenFile)
	stop(ctx, t, member)
	refusals(ctx, t, member, "raft.db", map[string]string{
		"emptied": "is damaged", "cut to a page": "is damaged", "pages flipped": "is damaged", "deleted": "holds no raft log or vote"})
}

// writeKeysOf makes calls on 400 keys, so that a store holds many pages.
func writeKeysOf(ctx context.Context, t *testing.T, url, tokenFile string) {
	t.Helper()
	src, err := spender.DialAllocator(url, spender.WithTokenFile(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "faults-corrupt", Epoch: 1, Sequence: uint64(i + 1)}}
		for k := range 10 {
			req.Keys = append(req.Keys, &leasev1.KeyAcquire{Key: fmt.Sprintf("sk-corrupt-%03d-%d", i, k), Limits: &leasev1.Limits{Rpm: 600},
				Want: &leasev1.Amount{Requests: 1}, Held: &leasev1.Amount{}})
		}
		if _, err := src.Acquire(ctx, req); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
}

// stop stops a with SIGTERM.
func stop(ctx context.Context, t *testing.T, a *allocatorProc) {
	t.Helper()
	a.signal(t, syscall.SIGTERM)
	a.stopped(ctx, t, 20*time.Second)
}

// refusals starts a on each damaged copy of its store file name (by the
// damage's name, with the reason its refusal must give), checks that it
// exits 1 naming the file, without a panic, then starts it on the sound
// file and waits until it is ready.
func refusals(ctx context.Context, t *testing.T, a *allocatorProc, name string, damages map[string]string) {
	t.Helper()
	path := filepath.Join(a.dataDir, name)
	sound, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	for damage, reason := range damages {
		b := append([]byte{}, sound...)
		switch damage {
		case "emptied":
			b = nil
		case "cut to a page":
			b = b[:page]
		case "pages flipped":
			for p := 2; p < len(b)/page; p++ {
				b[p*page+8] ^= 0x5a // each page's flags and count
			}
		}
		if damage == "deleted" {
			err = os.Remove(path)
		} else {
			err = os.WriteFile(path, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		a.launch(t)
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := a.wait(wctx)
		cancel()
		log := a.logs.String()
		switch {
		case !a.exited():
			t.Errorf("%s %s: the allocator still runs", name, damage)
			a.kill(t)
		case a.cmd.ProcessState.ExitCode() != 1:
			t.Errorf("%s %s: exit %v, want status 1", name, damage, err)
		case strings.Contains(log, "panic") || strings.Contains(log, "goroutine "):
			t.Errorf("%s %s: a panic:\n%s", name, damage, log)
		case !strings.Contains(log, path) || !strings.Contains(log, reason):
			t.Errorf("%s %s: the message does not name %s and say %q:\n%s", name, damage, path, reason, log)
		default:
			t.Logf("%s %s: refused: %s", name, damage, strings.TrimSpace(log[strings.LastIndex(strings.TrimSpace(log), "\n")+1:]))
		}
	}
	if err := os.WriteFile(path, sound, 0o600); err != nil {
		t.Fatal(err)
	}
	a.restart(ctx, t)
}
