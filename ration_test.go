package ration_test

import (
	"errors"
	"strings"
	"testing"

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
