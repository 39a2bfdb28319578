package ration_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration"
)

func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lim   ration.Limits
		field string // "" = valid
	}{
		{"zero is unlimited", ration.Limits{}, ""},
		{"typical", ration.Limits{RPM: 60, TPM: 90_000}, ""},
		{"bursts", ration.Limits{RPM: 60, TPM: 100, BurstRequests: 10, BurstTokens: 1000}, ""},
		{"the bound itself", ration.Limits{RPM: ration.MaxRate, TPM: ration.MaxRate}, ""},
		{"negative rpm", ration.Limits{RPM: -1}, "rpm"},
		{"rpm above the bound", ration.Limits{RPM: ration.MaxRate + 1}, "rpm"},
		{"tpm above the bound", ration.Limits{TPM: ration.MaxRate + 1}, "tpm"},
		{"negative burst on an unlimited dimension", ration.Limits{BurstTokens: -1}, "burst_tokens"},
		{"burst above the bound", ration.Limits{RPM: 5, BurstRequests: ration.MaxRate + 1}, "burst_requests"},
		{"per day", ration.Limits{RPM: 10_000, TPM: 2_000_000, Window: 24 * time.Hour}, ""},
		{"the longest window", ration.Limits{RPM: 1, Window: ration.MaxWindow}, ""},
		{"window above the bound", ration.Limits{RPM: 1, Window: ration.MaxWindow + time.Second}, "window"},
		{"window below a second", ration.Limits{RPM: 1, Window: time.Millisecond}, "window"},
		{"window not whole seconds", ration.Limits{RPM: 1, Window: 90500 * time.Millisecond}, "window"},
		{"negative window", ration.Limits{RPM: 1, Window: -time.Minute}, "window"},
		{"a day's rate too fine for exact arithmetic", ration.Limits{TPM: 999_999_937, Window: 24 * time.Hour}, "tpm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.lim.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tc.lim, err)
				}
				return
			}
			var le *ration.LimitsError
			if !errors.As(err, &le) || le.Field != tc.field || !errors.Is(err, ration.ErrInvalidLimits) {
				t.Fatalf("Validate(%+v) = %v, want a LimitsError on %s matching ErrInvalidLimits", tc.lim, err, tc.field)
			}
		})
	}
}

func TestValidKey(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want string // "" = valid
	}{
		{"k", ""},
		{strings.Repeat("k", ration.MaxKeyLen), ""},
		{"", "empty"},
		{strings.Repeat("k", ration.MaxKeyLen+1), "257 bytes, at most 256"},
		{"raw\xffsha", "not valid UTF-8"},
	} {
		err := ration.ValidKey(tc.id)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("ValidKey(%d bytes) = %v, want %q", len(tc.id), err, tc.want)
		}
	}
	if err := ration.ValidSpenderID(strings.Repeat("s", ration.MaxSpenderIDLen+1)); err == nil {
		t.Error("ValidSpenderID accepted an id over MaxSpenderIDLen")
	}
}

func TestLimitsCapacityAndLimited(t *testing.T) {
	lim := ration.Limits{RPM: 60, BurstRequests: 10}
	if got, want := lim.Capacity(), (ration.Amount{Requests: 10}); got != want {
		t.Errorf("Capacity() = %+v, want %+v", got, want)
	}
	if got, want := lim.Limited(ration.Amount{Requests: 3, Tokens: 500}), (ration.Amount{Requests: 3}); got != want {
		t.Errorf("Limited() = %+v, want %+v", got, want)
	}
	if got, want := (ration.Amount{Requests: -4, Tokens: 1 << 62}).Clamp(), (ration.Amount{Tokens: ration.MaxAmount}); got != want {
		t.Errorf("Clamp() = %+v, want %+v", got, want)
	}
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	tokens, err := ration.ReadTokenFile(write("ok", "# spenders\n  tok-1  \n\ntok-2\n", 0o600))
	if err != nil || len(tokens) != 2 || tokens[0] != "tok-1" || tokens[1] != "tok-2" {
		t.Fatalf("ReadTokenFile = %q, %v; want [tok-1 tok-2]", tokens, err)
	}
	for _, tc := range []struct {
		name, body string
		mode       os.FileMode
		want       string
	}{
		{"world-readable", "tok\n", 0o644, "chmod 600"},
		{"group-writable", "tok\n", 0o620, "chmod 600"},
		{"space in a token", "# c\ntok en\n", 0o600, "line 2: a token cannot contain spaces"},
		{"no token", "# only a comment\n\n", 0o600, "holds no token"},
	} {
		_, err := ration.ReadTokenFile(write(tc.name, tc.body, tc.mode))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "tok en") {
			t.Errorf("%s: the error echoes a token: %v", tc.name, err)
		}
	}
	if _, err := ration.ReadTokenFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}

	// Readable by its group: refused from a user's file, accepted from
	// root's (a Kubernetes secret volume with fsGroup, a systemd
	// credential). Root chowns its file away to test the refusal; a user
	// cannot make a root-owned one, so that half needs root (CI runs as
	// root).
	groupReadable := write("group-readable", "tok\n", 0o440)
	if os.Geteuid() == 0 {
		if tokens, err := ration.ReadTokenFile(groupReadable); err != nil || len(tokens) != 1 {
			t.Errorf("root-owned, mode 0440: %q, %v; want it accepted", tokens, err)
		}
		if err := os.Chown(groupReadable, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ration.ReadTokenFile(groupReadable); err == nil || !strings.Contains(err.Error(), "not owned by root; chmod 600") {
		t.Errorf("a user's file, mode 0440: %v; want it refused", err)
	}
}
