package spenderhttp

import "testing"

func TestEventEnd(t *testing.T) {
	tests := []struct {
		in        string
		end, sep  int
		wantEvent string
	}{
		{"data: a\n\n", 8, 1, "data: a\n"},
		{"data: a\r\n\r\nrest", 9, 2, "data: a\r\n"},
		{"data: a\r\rx", 8, 1, "data: a\r"},
		{"data: a\n", -1, 0, ""},
		{"data: a\r", -1, 0, ""},
		{"data: a\n\r", -1, 0, ""}, // the "\r" may be the start of "\r\n"
		{"event: x\ndata: b\n\ndata: c\n\n", 17, 1, "event: x\ndata: b\n"},
		{"\n", 0, 1, ""},
		{"", -1, 0, ""},
	}
	for _, tt := range tests {
		end, sep := eventEnd([]byte(tt.in))
		if end != tt.end || sep != tt.sep {
			t.Errorf("eventEnd(%q) = %d, %d; want %d, %d", tt.in, end, sep, tt.end, tt.sep)
			continue
		}
		if end >= 0 && tt.in[:end] != tt.wantEvent {
			t.Errorf("eventEnd(%q) event %q, want %q", tt.in, tt.in[:end], tt.wantEvent)
		}
	}
}

func TestSSEData(t *testing.T) {
	tests := []struct{ in, want string }{
		{"data: {\"a\":1}\n", `{"a":1}`},
		{"data:{\"a\":1}", `{"a":1}`},
		{"event: message\r\ndata: x\r\n", "x"},
		{"data: a\ndata: b\ndata: c\n", "a\nb\nc"},
		{": comment\nid: 3\n", ""},
		{"data:  two spaces", " two spaces"},
	}
	for _, tt := range tests {
		if got := string(sseData([]byte(tt.in))); got != tt.want {
			t.Errorf("sseData(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCountArray(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{`[]`, 0, false},
		{` [ ] `, 0, false},
		{`[1]`, 1, false},
		{`[1, 2, 3]`, 3, false},
		{`[[1,2],[3]]`, 2, false},
		{`["a,b", "[", {"x":[1,2]}]`, 3, false},
		{`[1,`, 0, true},
		{`{"a":1}`, 0, true},
	}
	for _, tt := range tests {
		got, err := countArray([]byte(tt.in))
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("countArray(%s) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}
