package ledger

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rationhq/ration"
)

// TestValidateAgreesWithApply: Validate refuses exactly the commands whose
// input State.Apply refuses, with the same error, and whatever it accepts
// encodes (so a proposer that validates first never fails an entry with
// another caller's bad input).
func TestValidateAgreesWithApply(t *testing.T) {
	caller := Caller{SpenderID: "gw", Epoch: 1, Sequence: 1}
	lim := ration.Limits{RPM: 600, TPM: 6000}
	cmds := []Command{
		Acquire{Now: 1, Caller: caller, Keys: []AcquireKey{{Key: "a", Limits: lim, Want: ration.Amount{Requests: 1, Tokens: 10}}}},
		ReserveAhead{Now: 1, Caller: caller, Keys: []ReserveKey{{Key: "a", Limits: lim, Cost: ration.Amount{Tokens: 10}, MaxWait: time.Second}}},
		Release{Now: 1, Caller: caller},
		Sweep{Now: 1},
	}
	for _, tc := range commandCases() {
		cmds = append(cmds, tc.cmd)
	}
	r := rand.New(rand.NewPCG(5, 2026))
	for range 2000 {
		cmds = append(cmds, randCommand(r))
	}
	valid := 0
	for i, cmd := range cmds {
		st, err := New(Config{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		verr := Validate(cmd)
		_, _, aerr := st.Apply(cmd)
		switch {
		case errors.Is(aerr, ErrInvalidArgument):
			if fmt.Sprint(verr) != aerr.Error() {
				t.Fatalf("command %d: Validate = %v, Apply = %v", i, verr, aerr)
			}
		case verr != nil:
			t.Fatalf("command %d: Validate = %v, but Apply accepted its input (%v)", i, verr, aerr)
		default:
			valid++
			if _, err := EncodeCommand(cmd); err != nil {
				t.Fatalf("command %d: valid but does not encode: %v", i, err)
			}
		}
	}
	if valid < 4 || valid == len(cmds) {
		t.Fatalf("%d of %d commands valid: the cases do not cover both sides", valid, len(cmds))
	}
	if Validate(nil) == nil {
		t.Fatal("Validate(nil) accepted")
	}
}
