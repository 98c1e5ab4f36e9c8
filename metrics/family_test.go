package metrics

import (
	"strings"
	"testing"
)

func TestAddFamilyFunc(t *testing.T) {
	m := New()
	var samples []Sample
	m.AddFamilyFunc("test_family_total", "counter", func() []Sample { return samples })
	var b strings.Builder
	m.WritePrometheus(&b)
	if strings.Contains(b.String(), "test_family_total") {
		t.Error("a family without samples wrote something")
	}
	samples = []Sample{{Labels: []string{"rule", "api", "reason", "nan"}, Value: 3}, {Labels: []string{"rule", "a\"b\\c\nd"}, Value: 0.5}}
	b.Reset()
	m.WritePrometheus(&b)
	for _, want := range []string{"# TYPE test_family_total counter\n", "test_family_total{rule=\"api\",reason=\"nan\"} 3\n",
		`test_family_total{rule="a\"b\\c\nd"} 0.5` + "\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
}
