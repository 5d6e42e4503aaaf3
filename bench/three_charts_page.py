"""An almost empty Streamlit page with three charts: bench/browser_page.py's floor, what any Streamlit page
with charts costs on this machine and browser (a title, a line and three small Altair line charts, drawn
as the dashboard draws its charts). Served with ``streamlit run``; reads nothing."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

st.set_page_config(page_title="three charts", layout="wide")
st.title("Three charts")
st.caption("The reference page of bench/browser_page.py.")
seconds = np.arange(600)
for name, series in (("sine", np.sin(seconds / 30)), ("cosine", np.cos(seconds / 45)), ("ramp", seconds / 600)):
    frame = pd.DataFrame({"t": pd.to_datetime(seconds, unit="s", utc=True), "value": series})
    st.altair_chart(alt.Chart(frame, title=name).mark_line().encode(x=alt.X("t:T", title=None), y="value:Q"),
                    width="stretch")
