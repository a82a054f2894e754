package host

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// PluginSpec says how to run a plugin process.
type PluginSpec struct {
	// Name is the plugin's name in logs and listings, e.g. "ws".
	Name string
	// Path is the executable; Args its arguments.
	Path string
	Args []string
	// SHA256 is the expected hex checksum of Path, or "".
	SHA256 string
}

// ErrChecksum: the plugin binary's checksum did not match.
var ErrChecksum = errors.New("plugin checksum mismatch")

// pluginProc is a running plugin subprocess.
type pluginProc struct {
	client *plugin.Client
	tr     *contract.TransportGRPCClient // kind transport
	be     *contract.BackendGRPCClient   // kind backend
}

// startPlugin starts spec as a go-plugin subprocess and dispenses kind.
func startPlugin(spec PluginSpec, kind string, log zerolog.Logger) (*pluginProc, error) {
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		Plugins:          contract.PluginMap(),
		Cmd:              exec.Command(spec.Path, spec.Args...),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		Stderr:           newPluginLogWriter(log, spec.Name),
	}
	if spec.SHA256 != "" {
		sum, err := hex.DecodeString(spec.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("plugin %s: checksum %q is not a hex sha256: %w", spec.Name, spec.SHA256, ErrChecksum)
		}
		cfg.SecureConfig = &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()}
	}
	client := plugin.NewClient(cfg)
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return nil, fmt.Errorf("plugin %s (%s): checksum does not match %s; check the path or the #sha256 suffix: %w", spec.Name, spec.Path, spec.SHA256, ErrChecksum)
		}
		return nil, fmt.Errorf("plugin %s (%s): %w", spec.Name, spec.Path, err)
	}
	raw, err := rpc.Dispense(kind)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("plugin %s: dispense %s: %w", spec.Name, kind, err)
	}
	p := &pluginProc{client: client}
	var ok bool
	switch kind {
	case contract.KindTransport:
		p.tr, ok = raw.(*contract.TransportGRPCClient)
	case contract.KindBackend:
		p.be, ok = raw.(*contract.BackendGRPCClient)
	}
	if !ok {
		client.Kill()
		return nil, fmt.Errorf("plugin %s: dispensed %T, not a %s", spec.Name, raw, kind)
	}
	return p, nil
}

// pluginLogWriter re-emits a plugin's stderr lines through the host's
// logger with a plugin field. JSON lines (zerolog's format) keep their
// level, message and fields; other lines are logged at info as they are.
type pluginLogWriter struct {
	log zerolog.Logger

	mu  sync.Mutex // guards buf
	buf []byte
}

func newPluginLogWriter(log zerolog.Logger, name string) io.Writer {
	return &pluginLogWriter{log: log.With().Str("plugin", name).Logger()}
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
		w.emit(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 {
		w.emit(w.buf)
		w.buf = nil
	}
	return len(p), nil
}

func (w *pluginLogWriter) emit(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
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
	delete(fields, "plugin")
	w.log.WithLevel(level).Fields(fields).Msg(msg)
}
