package metrics

import (
	"io"
	"strconv"
	"strings"

	vm "github.com/VictoriaMetrics/metrics"
)

// Sample is one series of a family read at scrape time.
type Sample struct {
	// Labels are name, value pairs in order: {"rule", "api", "reason", "nan"}.
	Labels []string
	Value  float64
}

// AddFamilyFunc exports a family of gauges or counters (typ "gauge" or
// "counter") with any labels, whose samples f returns at each scrape; a
// scrape without samples writes nothing of the family. f must be fast
// and safe for concurrent use, and a counter's values must never
// decrease. Label values are escaped as the text format wants.
func (m *Metrics) AddFamilyFunc(family, typ string, f func() []Sample) {
	m.set.RegisterMetricsWriter(func(w io.Writer) {
		samples := f()
		if len(samples) == 0 {
			return
		}
		vm.WriteMetadataIfNeeded(w, family, typ)
		var b strings.Builder
		for _, s := range samples {
			b.Reset()
			b.WriteString(family)
			for i := 0; i+1 < len(s.Labels); i += 2 {
				if i == 0 {
					b.WriteByte('{')
				} else {
					b.WriteByte(',')
				}
				b.WriteString(s.Labels[i])
				b.WriteString(`="`)
				b.WriteString(labelEscaper.Replace(s.Labels[i+1]))
				b.WriteByte('"')
			}
			if len(s.Labels) >= 2 {
				b.WriteByte('}')
			}
			b.WriteByte(' ')
			b.WriteString(strconv.FormatFloat(s.Value, 'g', -1, 64))
			b.WriteByte('\n')
			io.WriteString(w, b.String())
		}
	})
}

// labelEscaper escapes a label value of the text exposition format.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
