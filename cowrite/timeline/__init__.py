"""timeline"""
