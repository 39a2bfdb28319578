//go:build faults

package faults

import (
	"testing"
	"time"
)

// TestChildOutlivesNamespaceThread: a process started from the thread
// inNetns moved into a namespace is still running after inNetns returns.
// Children get SIGKILL when the thread that started them ends
// (Pdeathsig), so a namespace thread that ended instead of coming back
// killed whichever gateway or member had been started from it: a gateway
// of TestHostileClients died mid-run that way.
func TestChildOutlivesNamespaceThread(t *testing.T) {
	l := newNetLayout(t, 1)
	var p *proc
	inNetns(t, l.hosts[0].ns, func() {
		p = startProc(t, "sleep", "sleep", nil, "60")
	})
	select {
	case <-p.done:
		t.Fatalf("the child started in the namespace ended with its thread: %v", p.err)
	case <-time.After(500 * time.Millisecond):
	}
}
