package app

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
)

// TestNeedRestartNamesEveryCoalesceField: a reload keeps the running
// redis.coalesce (the store is built once), so a change to any of its
// fields must be named as needing a restart, not dropped in silence. The
// fields are walked by reflection: a new one without its line in
// needRestart fails here.
func TestNeedRestartNamesEveryCoalesceField(t *testing.T) {
	a := &App{}
	prev := config.Example()
	typ := reflect.TypeOf(prev.Redis.Coalesce)
	for i := range typ.NumField() {
		next := config.Example()
		f := reflect.ValueOf(&next.Redis.Coalesce).Elem().Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		case reflect.Int64: // time.Duration
			f.SetInt(f.Int() + int64(time.Millisecond))
		default:
			t.Fatalf("field %s: kind %s, teach this test to change it", typ.Field(i).Name, f.Kind())
		}
		got := a.needRestart(prev, next)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "redis.coalesce.") }) {
			t.Errorf("changing redis.coalesce's %s: needRestart named %v, want its redis.coalesce field", typ.Field(i).Name, got)
		}
	}
}
