package supervise

import "time"

// PluginStatus describes one plugin of the running host.
type PluginStatus struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // transport or backend
	// State is starting, running, restarting (died; the next attempt is
	// due), failed (a transport that failed RestartLimit times in a row;
	// reload it to try again) or stopped.
	State string `json:"state"`
	// Addr is the address a transport serves.
	Addr string `json:"addr,omitempty"`
	// Pid, Version and Started describe the running process (zero when
	// none runs).
	Pid     int       `json:"pid,omitempty"`
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started,omitzero"`
	// Restarts counts the times the supervisor restarted it after it
	// died; LastError is why it last died or failed to start.
	Restarts  int    `json:"restarts"`
	LastError string `json:"last_error,omitempty"`
	// LastReason is why it was last restarted: crashed or unresponsive.
	LastReason string `json:"last_reason,omitempty"`
	// Connections is the sockets it carries (transport) or the sockets
	// attached to its PTYs (backend).
	Connections int `json:"connections"`
	// PTYs is the backend's live PTYs; Reattached says the host
	// reattached to it (it was started by an earlier host).
	PTYs       int    `json:"ptys,omitempty"`
	Reattached bool   `json:"reattached,omitempty"`
	Path       string `json:"path,omitempty"`
}
