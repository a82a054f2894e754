package pty

// The screen model's memory is bounded whatever size the PTY is given, so
// that no resize can take the plugin's memory: x/vt keeps two screens
// (primary and alternate) of cols×rows cells each, every cell a uv.Cell
// of 112 bytes (229 bytes a cell for both screens, measured), and a
// scrollback of up to --pty-scrollback lines, each as wide as the
// terminal was when it scrolled off (128 bytes a cell, measured). The
// figures and the bound they give are in TestModelMemory.
const (
	// modelCells bounds the cells of each of the model's screens: a PTY
	// of more cells than this is modelled with its full width and only
	// as many of its bottom rows as fit (1000 columns: 131 rows; 10000:
	// 13), about 29 MiB for both screens.
	modelCells = 1 << 17
	// scrollbackCells bounds the cells of the model's scrollback, about
	// 16 MiB, unless --pty-scrollback lines of DefaultCols columns take
	// more: a wider terminal keeps fewer lines.
	scrollbackCells = 1 << 17
)

// modelSize is the size of the screen model of a cols×rows PTY: the PTY's
// own size when it has at most modelCells cells, else its full width
// (cols is never more than the 65535 a PTY can have, so a row fits) and
// as many rows as fit in modelCells.
func modelSize(cols, rows int) (mcols, mrows int) {
	mcols = max(1, min(cols, modelCells))
	return mcols, max(1, min(rows, modelCells/mcols))
}

// scrollbackLines is how many lines of scrollback a model cols wide keeps
// when it is configured to keep lines (0: none): all of them while they
// fit in scrollbackCells cells, or in lines×DefaultCols when that is
// more, else as many as fit (at least one).
func scrollbackLines(lines, cols int) int {
	if lines <= 0 {
		return 0
	}
	budget := max(scrollbackCells, lines*DefaultCols)
	return max(1, min(lines, budget/max(1, cols)))
}
