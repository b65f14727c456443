package fusebox

import (
	"testing"
	"time"
)

// The messages of the refusals, which operators read in the callers' logs.
func TestRefusalMessages(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"blocked", &BlockedError{Key: "k", Reason: "open"}, `fusebox: "k" blocked (open)`},
		{"blocked, retry after", &BlockedError{Key: "k", Reason: "open", RetryAfter: 10 * time.Second}, `fusebox: "k" blocked (open), retry after 10s`},
		{"denied", &DeniedError{Key: "k", Reason: "no_permits"}, `fusebox: "k" denied (no_permits)`},
		{"denied, retry after", &DeniedError{Key: "k", Reason: "queue_full", RetryAfter: 1500 * time.Millisecond}, `fusebox: "k" denied (queue_full), retry after 1.5s`},
		{"refused", &RefusedError{Key: "k"}, `fusebox: "k" refused (isolated)`},
	}
	for _, tc := range cases {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
