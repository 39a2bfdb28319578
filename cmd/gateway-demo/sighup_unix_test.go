//go:build unix

package main

import (
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rationhq/ration/gateway"
)

// TestSIGHUPReloadsKeys sends SIGHUP to this test process, wired as main
// wires it (notifyReload), with polling off: the signal alone reloads the
// keys file. notifyReload is in force before the signal is sent, so the
// signal cannot end the process.
func TestSIGHUPReloadsKeys(t *testing.T) {
	hup, stop := notifyReload()
	defer stop()
	path := writeKeys(t, []gateway.Key{{Key: "sk-a", ID: "a", Tenant: "t", RPM: 600}})
	cfg := testConfig(t, 2, path)
	cfg.keysReload = 0 // only the signal reloads
	f, logs := startFleetLogsDeps(t, cfg, deps{hup: hup})
	rewriteKeys(t, path, []gateway.Key{{Key: "sk-b", ID: "b", Tenant: "t", RPM: 600}})
	if st, _ := rawChat(t, f.instances[0].url, "sk-b", "early"); st != http.StatusUnauthorized {
		t.Fatalf("sk-b before the signal: %d; nothing but SIGHUP may reload here", st)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "SIGHUP reloaded the keys", func() bool {
		st, _ := rawChat(t, f.instances[0].url, "sk-b", "after")
		return st == http.StatusOK
	})
	for _, inst := range f.instances {
		if st, _ := rawChat(t, inst.url, "sk-a", "removed"); st != http.StatusUnauthorized {
			t.Errorf("%s: sk-a after the reload: %d, want 401", inst.url, st)
		}
		if st, _ := rawChat(t, inst.url, "sk-b", "added"); st != http.StatusOK {
			t.Errorf("%s: sk-b after the reload: %d", inst.url, st)
		}
	}
	if !strings.Contains(logs.String(), "trigger=signal keys=1 added=1 removed=1 changed=0") {
		t.Errorf("no reload log line for the signal:\n%s", logs.String())
	}
}
