package policy

import (
	"strings"
	"testing"
	"time"
)

// TestTooLongTTLSaysTheRealBound: a ttl over 400d is refused with "must be
// > 0 and <= 400d"; one over 100000d got the duration parser's "is too
// long (at most 100000d)", a bound that is not the field's: an operator
// who followed it (90000d) was refused again.
func TestTooLongTTLSaysTheRealBound(t *testing.T) {
	_, err := ParseOverride([]byte(`{"limit":3,"ttl":"1000000d"}`), time.Now())
	if err == nil {
		t.Fatal("accepted")
	}
	if !strings.Contains(err.Error(), "400d") {
		t.Errorf("error %q does not name the ttl's real bound (400d)", err)
	}
}
