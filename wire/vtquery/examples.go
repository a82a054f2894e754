package vtquery

// Example is one terminal query as a program sends it.
type Example struct {
	Name string // what it asks, e.g. "CPR"
	Seq  string // the bytes
}

// Examples returns one of each kind of query a Filter drops, as programs
// send them (7- and 8-bit introducers, BEL and ST terminators): for
// tests, here and of anything that must hold no query, like a PTY
// backend's snapshots.
func Examples() []Example {
	return []Example{
		{Name: "DA1", Seq: "\x1b[c"},
		{Name: "DA1 0", Seq: "\x1b[0c"},
		{Name: "DA1 C1", Seq: "\x9bc"},
		{Name: "DA2", Seq: "\x1b[>c"},
		{Name: "DA2 0", Seq: "\x1b[>0c"},
		{Name: "DA3", Seq: "\x1b[=c"},
		{Name: "DECID", Seq: "\x1bZ"},
		{Name: "DSR status", Seq: "\x1b[5n"},
		{Name: "CPR", Seq: "\x1b[6n"},
		{Name: "DECXCPR", Seq: "\x1b[?6n"},
		{Name: "DSR printer", Seq: "\x1b[?15n"},
		{Name: "DSR colour scheme", Seq: "\x1b[?996n"},
		{Name: "DECRQM ANSI", Seq: "\x1b[4$p"},
		{Name: "DECRQM DEC", Seq: "\x1b[?2004$p"},
		{Name: "DECRQM sync", Seq: "\x1b[?2026$p"},
		{Name: "XTVERSION", Seq: "\x1b[>q"},
		{Name: "XTVERSION 0", Seq: "\x1b[>0q"},
		{Name: "kitty keyboard", Seq: "\x1b[?u"},
		{Name: "XTQMODKEYS", Seq: "\x1b[?4m"},
		{Name: "XTSMGRAPHICS", Seq: "\x1b[?1;1;0S"},
		{Name: "XTWINOPS size px", Seq: "\x1b[14t"},
		{Name: "XTWINOPS cell px", Seq: "\x1b[16t"},
		{Name: "XTWINOPS size chars", Seq: "\x1b[18t"},
		{Name: "XTWINOPS screen chars", Seq: "\x1b[19t"},
		{Name: "XTWINOPS title", Seq: "\x1b[21t"},
		{Name: "XTWINOPS state", Seq: "\x1b[11t"},
		{Name: "DECREQTPARM", Seq: "\x1b[x"},
		{Name: "DECRQPSR", Seq: "\x1b[1$w"},
		{Name: "DECRQTSR", Seq: "\x1b[1$u"},
		{Name: "DECRQCRA", Seq: "\x1b[1;1;1;1;24;80*y"},
		{Name: "XTREPORTSGR", Seq: "\x1b[1;1;1;10#|"},
		{Name: "DECRQSS SGR ST", Seq: "\x1bP$qm\x1b\\"},
		{Name: "DECRQSS DECSCUSR", Seq: "\x1bP$q q\x1b\\"},
		{Name: "DECRQSS C1", Seq: "\x90$qr\x9c"},
		{Name: "XTGETTCAP", Seq: "\x1bP+q544e\x1b\\"},
		{Name: "OSC 10 BEL", Seq: "\x1b]10;?\a"},
		{Name: "OSC 11 ST", Seq: "\x1b]11;?\x1b\\"},
		{Name: "OSC 12", Seq: "\x1b]12;?\a"},
		{Name: "OSC 10 and 11", Seq: "\x1b]10;?;?\a"},
		{Name: "OSC 4", Seq: "\x1b]4;1;?\a"},
		{Name: "OSC 4 second", Seq: "\x1b]4;1;red;2;?\a"},
		{Name: "OSC 5", Seq: "\x1b]5;0;?\a"},
		{Name: "OSC 52", Seq: "\x1b]52;c;?\a"},
		{Name: "OSC C1", Seq: "\x9d11;?\x9c"},
		{Name: "kitty graphics", Seq: "\x1b_Gi=31,s=1,v=1,a=q,t=d,f=24;AAAA\x1b\\"},
		{Name: "ENQ", Seq: "\x05"},
	}
}
