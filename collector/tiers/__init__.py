"""How samples are stored: raw and packed GPU samples, host samples, the minute, hour and step rollups
and the compaction that packs closed days. Imports store and config."""
