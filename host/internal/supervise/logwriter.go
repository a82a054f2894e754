package supervise

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// stderrTailLines is how many of a plugin's last stderr lines are kept for
// start errors.
const stderrTailLines = 3

// pluginLogWriter re-emits a plugin's stderr lines through the host's
// logger with a plugin field. JSON lines (zerolog's format) keep their
// level, message and fields; other lines are logged at info as they are.
//
// At most logLinesPerSecond lines a second are re-emitted; the rest are
// counted and summarised in one line once the second is over, so a
// plugin flooding its stderr cannot flood the host's log (or its CPU).
type pluginLogWriter struct {
	log     zerolog.Logger
	field   string             // the field naming the writer ("plugin", "agent"), dropped from re-emitted lines
	dropped prometheus.Counter // lines dropped by the rate limit; may be nil
	now     func() time.Time

	mu          sync.Mutex // guards the fields below
	buf         []byte
	last        []string // the last few lines, for start errors
	window      time.Time
	lines       int // lines emitted in the window
	over        int // lines dropped in the window
	summaryTime *time.Timer
}

// logLinesPerSecond is how many stderr lines of one plugin are re-emitted
// per second at most.
const logLinesPerSecond = 1000

func newPluginLogWriter(log zerolog.Logger, name string, dropped prometheus.Counter) *pluginLogWriter {
	return newLogWriter(log, "plugin", name, dropped)
}

func newLogWriter(log zerolog.Logger, field, name string, dropped prometheus.Counter) *pluginLogWriter {
	w := &pluginLogWriter{log: log.With().Str(field, name).Logger(), field: field, dropped: dropped, now: time.Now}
	return w
}

// LogWriter re-emits the lines a process writes (its stderr) through log
// with field=name, as a plugin's are: JSON lines keep their level and
// fields, at most 1,000 lines a second, the rest counted (in dropped,
// when not nil) and summarised.
type LogWriter struct{ w *pluginLogWriter }

// NewLogWriter returns a LogWriter; Close it when the process is gone.
func NewLogWriter(log zerolog.Logger, field, name string, dropped prometheus.Counter) *LogWriter {
	return &LogWriter{w: newLogWriter(log, field, name, dropped)}
}

// Write implements io.Writer.
func (l *LogWriter) Write(p []byte) (int, error) { return l.w.Write(p) }

// Close reports what is still to be summarised.
func (l *LogWriter) Close() error {
	l.w.close()
	return nil
}

// Write implements io.Writer; go-plugin writes one line (or a part of a
// long one) per call.
func (w *pluginLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emitLocked(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 {
		w.emitLocked(w.buf)
		w.buf = nil
	}
	return len(p), nil
}

// tail returns the last lines the plugin wrote.
func (w *pluginLogWriter) tail() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := slices.Clone(w.last)
	if len(w.buf) > 0 {
		lines = append(lines, string(bytes.TrimSpace(w.buf)))
	}
	return lines
}

func (w *pluginLogWriter) emitLocked(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	if len(w.last) == stderrTailLines {
		w.last = append(w.last[:0], w.last[1:]...)
	}
	w.last = append(w.last, string(line[:min(len(line), 512)]))
	now := w.now()
	if now.Sub(w.window) >= time.Second {
		w.summarizeLocked()
		w.window, w.lines = now, 0
	}
	if w.lines >= logLinesPerSecond {
		w.over++
		if w.dropped != nil {
			w.dropped.Inc()
		}
		if w.summaryTime == nil {
			w.summaryTime = time.AfterFunc(time.Second-now.Sub(w.window), w.summarize)
		}
		return
	}
	w.lines++
	var fields map[string]any
	if line[0] != '{' || json.Unmarshal(line, &fields) != nil {
		w.log.Info().Msg(string(line))
		return
	}
	level := zerolog.InfoLevel
	if s, ok := fields[zerolog.LevelFieldName].(string); ok {
		if l, err := zerolog.ParseLevel(strings.ToLower(s)); err == nil {
			level = l
		}
	}
	msg, _ := fields[zerolog.MessageFieldName].(string)
	delete(fields, zerolog.LevelFieldName)
	delete(fields, zerolog.MessageFieldName)
	delete(fields, zerolog.TimestampFieldName)
	delete(fields, w.field)
	w.log.WithLevel(level).Fields(fields).Msg(msg)
}

// summarize reports the lines the rate limit dropped (the window's timer).
func (w *pluginLogWriter) summarize() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.summarizeLocked()
}

func (w *pluginLogWriter) summarizeLocked() {
	if w.summaryTime != nil {
		w.summaryTime.Stop()
		w.summaryTime = nil
	}
	if w.over > 0 {
		w.log.Warn().Int("dropped", w.over).Int("limit_per_second", logLinesPerSecond).
			Msg("plugin wrote more stderr lines than the limit; the rest of this second was dropped")
		w.over = 0
	}
}

// close reports what is still to be summarised and stops the timer.
func (w *pluginLogWriter) close() { w.summarize() }
