"""How samples are stored: raw and packed GPU samples, host samples, the minute, hour and step rollups
and the compaction that packs closed hours. Imports store and config."""
