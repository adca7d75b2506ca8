// "react" as an ES module for pages that load React's UMD build (window.React) without a bundler.
const React = globalThis.React;
export const { useCallback, useEffect, useMemo, useRef, useState, createElement, StrictMode } = React;
export default React;
