package sidecar_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	sidecarv1 "github.com/rationhq/ration/proto/ration/sidecar/v1"
	"github.com/rationhq/ration/sidecar"
)

// postJSON posts body to url with the Connect protocol's JSON and returns
// the status and body.
func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func charge(key string, rpm, tpm, tokens int64) *sidecarv1.Charge {
	return &sidecarv1.Charge{Key: key, Limits: &leasev1.Limits{Rpm: rpm, Tpm: tpm}, Cost: &leasev1.Amount{Requests: 1, Tokens: tokens}}
}

// TestReserveSettleCancel: Reserve charges all or nothing and returns an
// id and the headers; Settle refunds the unused estimate; Cancel returns
// everything; an id works once.
func TestReserveSettleCancel(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("key-1", 3, 1000, 600), charge("team:acme", 100, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Decision != sidecarv1.Decision_DECISION_ADMITTED || len(r.ReservationId) != 22 || r.HoldMs != sidecar.DefaultHold.Milliseconds() ||
		r.Headers["X-Ratelimit-Remaining-Requests"] != "2" || r.Headers["X-Ratelimit-Remaining-Tokens"] != "400" {
		t.Fatalf("reserve: %v", r)
	}
	// 600 reserved, 400 left: a second request of 600 tokens is refused
	// with the wait, and charges neither budget.
	r2, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("key-1", 3, 1000, 600), charge("team:acme", 100, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Decision != sidecarv1.Decision_DECISION_RATE_LIMITED || r2.ReservationId != "" || r2.Budget != "key-1" ||
		r2.RetryAfterMs != 12000 || r2.Headers["Retry-After"] != "12" || !strings.Contains(r2.Message, "rate limited on tokens") {
		t.Fatalf("second reserve: %v", r2)
	}
	if _, err := h.res.Settle(ctx, &sidecarv1.SettleRequest{ReservationId: r.ReservationId,
		Usage: []*leasev1.Amount{{Requests: 1, Tokens: 100}, {Requests: 1}}}); err != nil {
		t.Fatal(err)
	}
	r3, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("key-1", 3, 1000, 600)}})
	if err != nil || r3.Decision != sidecarv1.Decision_DECISION_ADMITTED || r3.Headers["X-Ratelimit-Remaining-Tokens"] != "300" {
		t.Fatalf("after settling 100: %v %v", r3, err)
	}
	if _, err := h.res.Cancel(ctx, &sidecarv1.CancelRequest{ReservationId: r3.ReservationId}); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		func() error {
			_, err := h.res.Cancel(ctx, &sidecarv1.CancelRequest{ReservationId: r3.ReservationId})
			return err
		}(),
		func() error {
			_, err := h.res.Settle(ctx, &sidecarv1.SettleRequest{ReservationId: r.ReservationId, Usage: []*leasev1.Amount{{}, {}}})
			return err
		}(),
		func() error {
			_, err := h.res.Cancel(ctx, &sidecarv1.CancelRequest{ReservationId: "guess"})
			return err
		}(),
	} {
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("a used or unknown id: %v, want NOT_FOUND", err)
		}
	}
	r4, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("key-1", 3, 1000, 2000)}})
	if err != nil || r4.Decision != sidecarv1.Decision_DECISION_TOO_LARGE || r4.Headers["X-Should-Retry"] != "false" ||
		r4.Headers["Retry-After"] != "" || r4.RetryAfterMs != 0 {
		t.Fatalf("too large: %v %v", r4, err)
	}
}

// TestReserveBadInput: bad input is INVALID_ARGUMENT naming what is
// wrong, over the Connect JSON a curl user sends, and reserves nothing.
func TestReserveBadInput(t *testing.T) {
	h := newHarness(t, nil)
	url := h.url + "/ration.sidecar.v1.ReservationService/"
	for _, c := range []struct{ method, body, want string }{
		{"Reserve", `{}`, "0 charges, want 1 to 16"},
		{"Reserve", `{"charges":[{"key":"","limits":{"rpm":1},"cost":{"requests":1}}]}`, "key id is empty"},
		{"Reserve", `{"charges":[{"key":"k","limits":{"rpm":-1},"cost":{"requests":1}}]}`, "invalid limits: rpm"},
		{"Reserve", `{"charges":[{"key":"k","limits":{"rpm":1},"cost":{"requests":-1}}]}`, "negative"},
		{"Reserve", `{"charges":[{"key":"k","limits":{"rpm":1}},{"key":"k","limits":{"rpm":1}}]}`, "name the same key"},
		{"Reserve", `{"charges":[{"key":"a"},{"key":"b"}],"maxWaitMs":"10"}`, "exactly one charge"},
		{"Reserve", `{"charges":[{"key":"a"}],"maxWaitMs":"3600001"}`, "want 0 to 3600000"},
		{"Reserve", `{"charges":[{"key":"a"}],"bogus":1}`, `unknown field \"bogus\"`},
		{"Settle", `{"reservationId":"x","usage":[{"tokens":"-1"}]}`, "negative"},
	} {
		code, body := postJSON(t, url+c.method, c.body)
		if code != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_argument"`) || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s, want 400 invalid_argument %q", c.method, c.body, code, body, c.want)
		}
	}
	code, body := postJSON(t, url+"Reserve", `{"charges":[{"key":"k","limits":{"rpm":"1"},"cost":{"requests":"1"}}]}`)
	if code != 200 || !strings.Contains(body, `"decision":"DECISION_ADMITTED"`) {
		t.Fatalf("the bad requests charged something: %d %s", code, body)
	}
	code, body = postJSON(t, url+"Reserve", strings.Repeat(" ", sidecar.MaxMessageBytes+1))
	if code == 200 || code >= 500 {
		t.Fatalf("a body over the cap: %d %s", code, body)
	}
}

// TestSettleWrongCount: a usage list that does not match the charges is
// refused and the reservation stays, to be settled right.
func TestSettleWrongCount(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("k", 10, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.res.Settle(ctx, &sidecarv1.SettleRequest{ReservationId: r.ReservationId, Usage: []*leasev1.Amount{{}, {}}})
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "2 amounts for 1 charges") {
		t.Fatalf("err = %v", err)
	}
	if _, err := h.res.Settle(ctx, &sidecarv1.SettleRequest{ReservationId: r.ReservationId, Usage: []*leasev1.Amount{{Requests: 1}}}); err != nil {
		t.Fatal(err)
	}
}

// TestOpenReservationsBounded: past -max-open-reservations a Reserve is
// UNAVAILABLE and charges nothing; settling one makes room.
func TestOpenReservationsBounded(t *testing.T) {
	h := newHarness(t, nil, sidecar.WithMaxOpen(2))
	ctx := context.Background()
	var ids []string
	for range 2 {
		r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("k", 10, 0, 0)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ReservationId)
	}
	_, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("k", 10, 0, 0)}})
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "2 reservations are open") {
		t.Fatalf("past the bound: %v", err)
	}
	if _, err := h.res.Cancel(ctx, &sidecarv1.CancelRequest{ReservationId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("k", 10, 0, 0)}})
	if err != nil || r.Headers["X-Ratelimit-Remaining-Requests"] != "8" {
		t.Fatalf("after a cancel: %v %v", r, err) // 10 - 2 held (the refused one charged nothing)
	}
}

// TestHoldExpiry: a reservation neither settled nor cancelled within the
// hold time is settled at its reserved cost, and its id is gone.
func TestHoldExpiry(t *testing.T) {
	h := newHarness(t, nil, sidecar.WithHold(time.Minute))
	ctx := context.Background()
	r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{charge("k", 10, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(time.Minute)
	waitOpen(t, h.svc, 0)
	if _, err := h.res.Cancel(ctx, &sidecarv1.CancelRequest{ReservationId: r.ReservationId}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("cancel after the hold: %v", err)
	}
}

// TestWaitMode: with max_wait_ms and one charge, a budget that is short
// now but covers the cost in time admits with send_after_ms; one that
// does not is refused and reserves nothing.
func TestWaitMode(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	c := charge("vendor", 30, 0, 0) // one request every 2 s
	for range 30 {
		if r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{c}}); err != nil || r.Decision != sidecarv1.Decision_DECISION_ADMITTED {
			t.Fatal(r, err)
		}
	}
	r, err := h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{c}, MaxWaitMs: 5000})
	if err != nil || r.Decision != sidecarv1.Decision_DECISION_ADMITTED || r.SendAfterMs != 2000 {
		t.Fatalf("wait mode: %v %v", r, err)
	}
	r, err = h.res.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{c}, MaxWaitMs: 3000})
	if err != nil || r.Decision != sidecarv1.Decision_DECISION_RATE_LIMITED || r.RetryAfterMs != 4000 {
		t.Fatalf("wait mode, not in time: %v %v", r, err)
	}
}
