package policy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"
)

// watchSettle is how long the watcher waits after the last file event
// before it reads the file: editors and ConfigMap updates touch several
// files in a burst. A new content is reloaded once it read the same twice,
// a settle apart: a tool rewriting the file in place, caught between two
// writes, would otherwise be reloaded with a file cut short (which can be
// a valid, more generous policy: "cost: 10" cut to "cost: 1").
const watchSettle = 100 * time.Millisecond

// Watch calls reload whenever the content of the config file at path
// changes, until ctx ends. It watches the file's directory (and, when path
// is a symlink, the directory of its target) rather than the file itself, so
// it survives editors that write a new file and rename it over the old one,
// and Kubernetes ConfigMap volumes, which swap a "..data" symlink. It
// compares the file's content, so events that leave the content as it was
// (swap files, chmod, a touch) reload nothing.
func Watch(ctx context.Context, path string, log zerolog.Logger, reload func()) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	watched := map[string]bool{}
	addDirs := func() error {
		dirs := []string{filepath.Dir(abs)}
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		for _, d := range dirs {
			if watched[d] {
				continue
			}
			if err := w.Add(d); err != nil {
				return err
			}
			watched[d] = true
		}
		return nil
	}
	if err := addDirs(); err != nil {
		w.Close()
		return fmt.Errorf("watch %s: %w", path, err)
	}
	last, _ := fileHash(abs)
	var pending [32]byte // a new content read once, not yet reloaded
	go func() {
		defer w.Close()
		settle := time.NewTimer(time.Hour)
		settle.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn().Err(err).Str("config", path).Msg("config file watch error")
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				settle.Reset(watchSettle)
			case <-settle.C:
				// A symlink swap may have moved the target to a new directory.
				if err := addDirs(); err != nil {
					log.Warn().Err(err).Str("config", path).Msg("cannot watch the config file's directory")
				}
				h, err := fileHash(abs)
				if err != nil || h == last {
					// Mid-replace (absent) or unchanged: wait for the next
					// event. What was read once before counts no more: a
					// content must read the same twice in a row.
					pending = [32]byte{}
					continue
				}
				if h != pending {
					// Read once: read it again a settle later, and reload
					// only what stayed.
					pending = h
					settle.Reset(watchSettle)
					continue
				}
				last, pending = h, [32]byte{}
				log.Info().Str("config", path).Msg("config file changed; reloading")
				reload()
			}
		}
	}()
	return nil
}

func fileHash(path string) ([32]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}
